"""Sentence pairs (source, target) from a TSV or JSONL file, every fault named by file and line.

TSV (``.tsv``): a header row naming (at least) the source and target columns, then one pair per
line, columns separated by a tab. No quoting: a field is everything between two tabs, so a
sentence may hold quotes but not a tab or a line break. JSONL (``.jsonl`` / ``.json``): one
object per line with both fields as strings. Blank lines are skipped; an empty sentence is an
error (there is nothing to learn from it).

Pairs are compared after :func:`~.words.split_words` (lower-cased tokens), the form the model
sees: two spellings that tokenise alike are one sentence, for deduplication and for the split.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ...checks import check_unicode
from ...io import parse_json_object, read_lines
from .words import split_words


@dataclass(frozen=True)
class Pair:
    source: str
    target: str
    where: str  # "FILE line N": where it was read

    @property
    def key(self) -> tuple[str, ...]:
        """The source as the model sees it: one sentence for deduplication and the split."""
        return tuple(split_words(self.source))


def read_pairs(path: str | Path, source_field: str, target_field: str) -> list[Pair]:
    """Every (source, target) row of the file.

    Raises:
        FileNotFoundError: no such file.
        ValueError: an empty file, bytes that are not UTF-8, an unknown suffix, a missing column
            or field, an empty sentence; naming file and line.
    """
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"data file not found: {file}")
    suffix = file.suffix.lower()
    if suffix not in (".tsv", ".jsonl", ".json"):
        raise ValueError(f"{file}: expected a .tsv or .jsonl file, got suffix {suffix!r}")
    lines = read_lines(file.read_bytes(), str(file))  # names the line of a byte not UTF-8
    if not any(line.strip() for line in lines):
        raise ValueError(
            f"{file} is empty: expected sentence pairs ({source_field}, {target_field})"
        )
    fields = (source_field, target_field)
    pairs = _tsv(lines, file, fields) if suffix == ".tsv" else _jsonl(lines, file, fields)
    if not pairs:
        raise ValueError(f"{file} has a header but no sentence pairs")
    return pairs


def _pair(source, target, where: str, fields: tuple[str, str]) -> Pair:
    for value, name in zip((source, target), fields, strict=True):
        if not isinstance(value, str):
            raise ValueError(f"{where}: {name!r} must be a string, got {type(value).__name__}")
        if not value.strip():
            raise ValueError(f"{where}: the {name!r} is empty")
        check_unicode(value, f"{where}: {name!r}")
    return Pair(source.strip(), target.strip(), where)


def _tsv(lines: list[str], file: Path, fields: tuple[str, str]) -> list[Pair]:
    header = lines[0].split("\t")
    missing = [f for f in fields if f not in header]
    if missing:
        raise ValueError(
            f"{file} line 1: the header must name the tab-separated columns {fields[0]!r} and "
            f"{fields[1]!r}, got {header}"
        )
    columns = [header.index(f) for f in fields]
    pairs = []
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        cells = line.split("\t")
        if len(cells) <= max(columns):
            name = fields[0] if len(cells) <= columns[0] else fields[1]
            raise ValueError(
                f"{file} line {number}: the row has {len(cells)} column(s), no {name!r} "
                f"(the header has {len(header)}; are the columns separated by tabs?)"
            )
        where = f"{file} line {number}"
        pairs.append(_pair(cells[columns[0]], cells[columns[1]], where, fields))
    return pairs


def _jsonl(lines: list[str], file: Path, fields: tuple[str, str]) -> list[Pair]:
    pairs = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{file} line {number}"
        item = parse_json_object(line, where)
        for name in fields:
            if name not in item:
                raise ValueError(
                    f"{where}: the object has no {name!r} field (fields: {sorted(item)[:6]})"
                )
        pairs.append(_pair(item[fields[0]], item[fields[1]], where, fields))
    return pairs


def deduplicate_pairs(pairs: Sequence[Pair]) -> tuple[list[Pair], int]:
    """Each pair once (its first occurrence, compared as tokens) and the number dropped."""
    seen: set[tuple] = set()
    kept = []
    for pair in pairs:
        key = (pair.key, tuple(split_words(pair.target)))
        if key not in seen:
            seen.add(key)
            kept.append(pair)
    return kept, len(pairs) - len(kept)


def split_by_source(
    pairs: Sequence[Pair], fraction: float, seed: int
) -> tuple[list[Pair], list[Pair]]:
    """(training, held-out) pairs: ``fraction`` of the distinct sources is held out, with all
    their translations, so no source is in both halves (a model would be scored on a sentence
    it learnt). The sources are drawn by a generator of ``seed``, from their sorted order, so
    the split depends on the set of sources, not on the file's order."""
    sources = sorted({p.key for p in pairs})
    order = torch.randperm(len(sources), generator=torch.Generator().manual_seed(seed)).tolist()
    n_held = min(max(round(fraction * len(sources)), 1), len(sources) - 1)
    held = {sources[i] for i in order[:n_held]}
    return [p for p in pairs if p.key not in held], [p for p in pairs if p.key in held]
