"""Retrieval training rows: an anchor (a query), its positive (a relevant text) and, optionally,
hard negatives (texts close to the anchor that are not relevant).

Files: JSONL rows ``{"anchor": str, "positive": str, "negative": [str, ...]}`` (``negative``
optional; one string is one negative), or CSV / TSV with a header naming ``anchor``,
``positive`` and optionally ``negative`` (one negative a row) or ``negative_1``,
``negative_2``, ... columns, as sentence-transformers' datasets have them. Every fault is an
error naming the file, the line and the field, raised before any model is loaded.

Other fields and columns are not read, except that those which look like negatives
(``negatives``, ``hard_negative``, ``negative_id``, ``negative_score``, ...) are refused: read
as texts, an id or a score column would be trained on; left out, a misnamed list would train
without the negatives the file meant to give.
"""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import dataclass
from pathlib import Path

from ..checks import check_unicode

NEGATIVE_COLUMN = re.compile(r"negative(_[0-9]+)?")  # negative, negative_1, negative_2, ...


@dataclass(frozen=True)
class Pair:
    anchor: str
    positive: str
    negatives: tuple[str, ...]
    line: int  # in the file, for messages


def read_pairs(path: str | Path, name: str = "train_file") -> list[Pair]:
    """Every row of ``path``, checked; a clear error for any fault. ``name`` is what the
    caller calls the file (``train_file``; ``--pairs`` for ``clearformer mine``)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{name} {path}: no such file")
    if path.suffix in (".jsonl", ".json"):
        rows = _jsonl_rows(path)
    elif path.suffix in (".csv", ".tsv"):
        rows = _table_rows(path, "\t" if path.suffix == ".tsv" else ",")
    else:
        raise ValueError(
            f"{name} {path}: expected a .jsonl, .csv or .tsv file, got {path.suffix!r}"
        )
    pairs = [_pair(path, line, row) for line, row in rows]
    if not pairs:
        raise ValueError(f"{name} {path}: no rows")
    return pairs


def _looks_like_negatives(name: str) -> bool:
    return "neg" in name.casefold()


def _jsonl_rows(path: Path):
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except (ValueError, RecursionError) as exc:
                raise ValueError(f"{path}, line {number}: not a JSON object ({exc})") from None
            if not isinstance(row, dict):
                raise ValueError(
                    f"{path}, line {number}: expected a JSON object, got {type(row).__name__}"
                )
            for key in row:
                if key != "negative" and _looks_like_negatives(key):
                    raise ValueError(
                        f"{path}, line {number}: field {key!r} is not read: a row's negatives "
                        "are the field 'negative' (a string or a list of strings)"
                    )
            yield number, row


def _table_rows(path: Path, delimiter: str):
    text = utf8_text(path)
    # TSV has no quoting: a quote is part of its text. CSV quotes as RFC 4180 says, strictly,
    # so that a quote left open is an error rather than the rest of the file in one field.
    dialect = {"quoting": csv.QUOTE_NONE} if delimiter == "\t" else {"strict": True}
    limit = csv.field_size_limit()
    csv.field_size_limit(2**31 - 1)  # a long document is one field
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""), delimiter=delimiter, **dialect)
        header = reader.fieldnames or []
        for name in ("anchor", "positive"):
            if name not in header:
                raise ValueError(f"{path}, line 1: the header has no {name!r} column: {header}")
        negative_columns = _negative_columns(path, header)
        while True:
            start = reader.line_num + 1  # the line this row starts on (a field may span lines)
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:  # its own line count stops where the error began
                raise ValueError(f"{path}, line {start}: {exc} (a quote left open?)") from None
            extra = row.pop(None, [])  # fields past the header's (DictReader's restkey)
            missing = sum(value is None for value in row.values())  # fields short of it
            if extra or missing:
                raise ValueError(
                    f"{path}, line {reader.line_num}: {len(header) + len(extra) - missing} "
                    f"fields, the header names {len(header)}"
                )
            negatives = [row[h] for h in negative_columns if row[h] != ""]
            yield (
                reader.line_num,
                {"anchor": row["anchor"], "positive": row["positive"], "negative": negatives},
            )
    finally:
        csv.field_size_limit(limit)


def _negative_columns(path: Path, header: list[str]) -> list[str]:
    """The header's negative columns; one that only looks like one (an id, a score) is
    refused rather than read as a text or left out."""
    for name in header:
        if _looks_like_negatives(name) and not NEGATIVE_COLUMN.fullmatch(name):
            raise ValueError(
                f"{path}, line 1: column {name!r} is not read: negatives are the columns "
                "'negative' or 'negative_1', 'negative_2', ..."
            )
    return [name for name in header if NEGATIVE_COLUMN.fullmatch(name)]


def utf8_text(path: Path) -> str:
    """The file's text; a byte-order mark (as spreadsheets write) is not text. Bytes that are
    not UTF-8: a ValueError naming the file, the line and the byte."""
    data = path.read_bytes()
    # The mark is cut here rather than by "utf-8-sig", whose error positions do not count it.
    data = data.removeprefix(b"\xef\xbb\xbf")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ValueError(
            f"{path}, line {line}: not UTF-8 text (byte {data[exc.start]:#04x})"
        ) from None


def _pair(path: Path, line: int, row: dict) -> Pair:
    where = f"{path}, line {line}"
    for name in ("anchor", "positive"):
        if name not in row:
            raise ValueError(f"{where}: field {name!r} is missing")
        value = row[name]
        if not isinstance(value, str):
            raise ValueError(
                f"{where}: field {name!r} must be a string, got {type(value).__name__}"
            )
        if not value.strip():
            raise ValueError(f"{where}: field {name!r} is empty")
        # A lone surrogate (JSON's "\ud800") would fail in the tokenizer, after the model
        # has loaded, with a message that names neither the file nor the text.
        check_unicode(value, f"{where}: field {name!r}")
    negatives = row.get("negative", [])
    if isinstance(negatives, str):
        negatives = [negatives]
    if not isinstance(negatives, list):
        raise ValueError(
            f"{where}: field 'negative' must be a list of strings, got {type(negatives).__name__}"
        )
    for i, negative in enumerate(negatives):
        if not isinstance(negative, str) or not negative.strip():
            raise ValueError(f"{where}: field 'negative' item {i} must be a non-empty string")
        check_unicode(negative, f"{where}: field 'negative' item {i}")
    # Compared as the tokenizer sees them: leading and trailing spaces make no other text.
    anchor, positive = row["anchor"].strip(), row["positive"].strip()
    if anchor == positive:
        raise ValueError(f"{where}: the anchor equals its positive: nothing to learn from it")
    seen: dict[str, int] = {}
    for i, negative in enumerate(n.strip() for n in negatives):
        if negative == positive:
            raise ValueError(f"{where}: the positive is also among the negatives (item {i})")
        if negative == anchor:
            raise ValueError(f"{where}: the anchor is also among the negatives (item {i})")
        if negative in seen:
            raise ValueError(f"{where}: field 'negative' item {i} repeats item {seen[negative]}")
        seen[negative] = i
    return Pair(row["anchor"], row["positive"], tuple(negatives), line)
