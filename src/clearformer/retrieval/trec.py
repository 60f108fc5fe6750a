"""Runs in TREC format: ``query-id Q0 document-id rank score tag``, one line a document.

Written in trec_eval's order (score descending, then document id descending), so that the rank
column is the rank trec_eval scores by and the file gives the same figures to ``trec_eval``,
``pytrec_eval`` and ``clearformer eval``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from .metrics import ranked


def check_ids(ids, what: str) -> None:
    """ValueError if an id holds whitespace, which separates a run line's fields."""
    for name in ids:
        if any(character.isspace() for character in name):
            raise ValueError(
                f"{what} id {name!r} holds whitespace, which separates the fields of a TREC "
                "run line; a run file cannot name it"
            )


def run_lines(run: Mapping[str, Mapping[str, float]], tag: str):
    check_ids(run, "query")
    for scores in run.values():
        check_ids(scores, "document")
    check_ids([tag], "tag")
    for query, scores in run.items():
        for rank, document in enumerate(ranked(scores), start=1):
            yield f"{query} Q0 {document} {rank} {scores[document]!r} {tag}\n"


def write_run(path: str | Path, run: Mapping[str, Mapping[str, float]], tag: str) -> None:
    """Write ``run`` to ``path`` atomically (a reader never sees half a file).

    Raises:
        ValueError: an id holds whitespace (checked before anything is written).
    """
    from ..io import atomic_write

    with atomic_write(Path(path), "w") as f:
        f.writelines(run_lines(run, tag))


def read_run(path: str | Path) -> dict[str, dict[str, float]]:
    """A TREC run file back as query id -> document id -> score."""
    run: dict[str, dict[str, float]] = {}
    with Path(path).open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            fields = line.split()
            if not fields:
                continue
            if len(fields) != 6:
                raise ValueError(f"{path}, line {number}: expected 6 fields, got {len(fields)}")
            run.setdefault(fields[0], {})[fields[2]] = float(fields[4])
    return run
