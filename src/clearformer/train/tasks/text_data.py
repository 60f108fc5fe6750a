"""Texts from a data file, every fault named by file and line.

Labelled (classify): CSV, a header row naming (at least) the text and label columns; JSONL,
one object per line with both fields. The format is the file's suffix (``.csv``, ``.jsonl`` /
``.json``); labels are read as strings (``1`` and ``"1"`` are one label).

Plain (mlm, :func:`read_texts`): the same files without labels, or a ``.txt`` file, whose
texts are its non-blank lines or its paragraphs (runs of non-blank lines, joined by spaces).
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path

from ...checks import check_unicode
from ...io import parse_json_object


@dataclass(frozen=True)
class LabelledText:
    text: str
    label: str
    line: int  # where it was read (1-based; CSV: the record's first line)


def read_labelled(path: str | Path, text_field: str, label_field: str) -> list[LabelledText]:
    """Every (text, label) row of the file.

    Raises:
        FileNotFoundError: no such file.
        ValueError: an empty file, bytes that are not UTF-8, an unknown suffix, a row that is
            not an object or lacks a field, an empty text or label; naming file and line.
    """
    file, text = _read_file(path, f"labelled texts ({text_field}, {label_field})")
    suffix = file.suffix.lower()
    if suffix == ".csv":
        rows = _csv_rows(text, file, text_field, label_field)
    elif suffix in (".jsonl", ".json"):
        rows = _jsonl_rows(text, file, text_field, label_field)
    else:
        raise ValueError(f"{file}: expected a .csv or .jsonl file, got suffix {suffix!r}")
    if not rows:
        raise ValueError(f"{file} has a header but no rows of labelled text")
    return rows


def read_texts(path: str | Path, text_field: str, unit: str = "line") -> list[LabelledText]:
    """Every text of a ``.txt`` file (``unit``: ``line``, each non-blank line; ``paragraph``,
    each run of non-blank lines joined by spaces), or of the ``text_field`` of a CSV or JSONL
    file; labels are empty. Faults are named as :func:`read_labelled` names them.
    """
    file, text = _read_file(path, "texts")
    suffix = file.suffix.lower()
    if suffix == ".txt":
        rows = _txt_rows(text, file, unit)
    elif suffix == ".csv":
        rows = _csv_rows(text, file, text_field, None)
    elif suffix in (".jsonl", ".json"):
        rows = _jsonl_rows(text, file, text_field, None)
    else:
        raise ValueError(f"{file}: expected a .txt, .csv or .jsonl file, got suffix {suffix!r}")
    if not rows:
        raise ValueError(f"{file} has no texts")
    return rows


def _read_file(path: str | Path, expected: str) -> tuple[Path, str]:
    """The file's text; a missing file, bytes that are not UTF-8 or an empty file is an error."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"data file not found: {file}")
    data = file.read_bytes()
    try:
        text = data.decode("utf-8-sig")  # a byte-order mark is not part of the first field
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ValueError(
            f"{file} line {line}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
            f"{exc.start}); convert the file to UTF-8"
        ) from None
    if not text.strip():
        raise ValueError(f"{file} is empty: expected {expected}")
    return file, text


def _txt_rows(text: str, file: Path, unit: str) -> list[LabelledText]:
    rows: list[LabelledText] = []
    block: list[str] = []
    start = 0
    for line, raw in enumerate([*text.splitlines(), ""], start=1):  # "": ends the last block
        stripped = raw.strip()
        if stripped and unit == "line":
            rows.append(_row(stripped, None, file, line, "text", None))
        elif stripped:
            start = start or line
            block.append(stripped)
        elif block:
            rows.append(_row(" ".join(block), None, file, start, "text", None))
            block, start = [], 0
    return rows


def _row(value_text, value_label, file: Path, line: int, text_field: str, label_field):
    """One checked row; ``label_field`` None: a plain text (no label)."""
    if not isinstance(value_text, str):
        raise ValueError(
            f"{file} line {line}: {text_field!r} must be a string, got {type(value_text).__name__}"
        )
    if label_field is None:
        if not value_text.strip():
            raise ValueError(f"{file} line {line}: the {text_field!r} is empty")
        check_unicode(value_text, f"{file} line {line}: {text_field!r}")
        return LabelledText(value_text, "", line)
    if isinstance(value_label, bool) or not isinstance(value_label, (str, int)):
        raise ValueError(
            f"{file} line {line}: {label_field!r} must be a string or an int, got "
            f"{type(value_label).__name__}"
        )
    label = str(value_label).strip()
    if not value_text.strip():
        raise ValueError(f"{file} line {line}: the {text_field!r} is empty")
    if not label:
        raise ValueError(f"{file} line {line}: the {label_field!r} is empty")
    check_unicode(value_text, f"{file} line {line}: {text_field!r}")
    return LabelledText(value_text, label, line)


def _csv_rows(text: str, file: Path, text_field: str, label_field) -> list[LabelledText]:
    reader = csv.DictReader(io.StringIO(text, newline=""))
    header = reader.fieldnames or []
    wanted = [f for f in (text_field, label_field) if f is not None]
    if any(f not in header for f in wanted):
        raise ValueError(
            f"{file} line 1: the header must name the columns "
            f"{' and '.join(repr(f) for f in wanted)}, got {header}"
        )
    rows = []
    line = reader.line_num
    for record in reader:
        start, line = line + 1, reader.line_num
        if not any((v or "").strip() for v in record.values() if isinstance(v, str)):
            continue  # a blank line
        if label_field is not None and record.get(label_field) is None:
            raise ValueError(f"{file} line {start}: the row has no {label_field!r} value")
        label = record.get(label_field) if label_field is not None else None
        rows.append(_row(record[text_field], label, file, start, text_field, label_field))
    return rows


def _jsonl_rows(text: str, file: Path, text_field: str, label_field) -> list[LabelledText]:
    rows = []
    for line, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        item = parse_json_object(raw, f"{file} line {line}")
        for name in (f for f in (text_field, label_field) if f is not None):
            if name not in item:
                raise ValueError(
                    f"{file} line {line}: the object has no {name!r} field "
                    f"(fields: {sorted(item)[:6]})"
                )
        label = item[label_field] if label_field is not None else None
        rows.append(_row(item[text_field], label, file, line, text_field, label_field))
    return rows


def deduplicate(rows: list[LabelledText], source: str) -> tuple[list[LabelledText], int, int]:
    """The rows with each text once (its first occurrence), the number dropped, and how many
    of those disagreed on the label. A text both in train and held out would score the model
    on what it memorised, so duplicates go before the split."""
    seen: dict[str, str] = {}
    kept, conflicts = [], 0
    for row in rows:
        if row.text in seen:
            conflicts += seen[row.text] != row.label
            continue
        seen[row.text] = row.label
        kept.append(row)
    return kept, len(rows) - len(kept), conflicts
