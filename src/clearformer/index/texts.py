"""The texts and ids of an index segment, in SQLite beside its vectors.

SQLite, not Parquet: a search reads k rows by number, which SQLite answers from its B-tree in
microseconds, where a Parquet reader decodes whole row groups. A segment's database is written
once, under a temporary name, and never changed; readers open it read-only and ``immutable``,
so no reader takes a lock or sees a journal.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

from .layout import IndexDamagedError

_BATCH = 10_000  # rows per INSERT batch


def write_texts(path: Path, ids: Sequence[str], texts: Sequence[str]) -> None:
    """A new database at ``path`` (which must not exist) with rows 0..n-1."""
    _write_rows(path, 0, ids, texts)


def append_texts(
    source: Path, path: Path, first: int, ids: Sequence[str], texts: Sequence[str]
) -> None:
    """A new database at ``path``: a copy of ``source`` (rows 0..first-1) with ``texts`` as
    rows ``first`` onwards. ``source`` is not changed: its readers open it ``immutable``, so
    the rows are added to a copy, which the caller renames into place."""
    _write_rows(path, first, ids, texts, source=source)


def _write_rows(
    path: Path, first: int, ids: Sequence[str], texts: Sequence[str], *, source: Path | None = None
) -> None:
    """``texts`` as rows ``first`` onwards of the new file ``path``: a new table, or a copy of
    ``source`` added to; written in batches, then synced."""
    if len(ids) != len(texts):
        raise ValueError(f"ids and texts must be as many, got {len(ids)} and {len(texts)}")
    if source is not None:
        shutil.copyfile(source, path)
    connection = sqlite3.connect(path)
    try:
        connection.execute("PRAGMA journal_mode = OFF")  # a new file: nothing to roll back to
        if source is None:
            connection.execute("CREATE TABLE texts (row INTEGER PRIMARY KEY, id TEXT, text TEXT)")
        for start in range(0, len(texts), _BATCH):
            end = start + _BATCH
            rows = zip(
                range(first + start, first + end), ids[start:end], texts[start:end], strict=False
            )
            connection.executemany("INSERT INTO texts VALUES (?, ?, ?)", rows)
        connection.commit()
    finally:
        connection.close()
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


class TextStore:
    """A segment's texts, read-only.

    The database is opened once, when the store is made (as the index is opened), and kept
    open: a reader keeps reading the rows it opened after later commits remove the file (an
    open file outlives its name, as the memory-mapped vectors do). One connection serves
    every thread, one query at a time.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        uri = f"{path.resolve().as_uri()}?mode=ro&immutable=1"
        self._lock = threading.Lock()
        try:
            self._connection = sqlite3.connect(uri, uri=True, check_same_thread=False)
            # SQLite opens a file lazily: read its schema now, while the name still holds it.
            self._connection.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.Error as exc:
            raise self._damaged(exc) from None

    def _damaged(self, exc: sqlite3.Error) -> IndexDamagedError:
        reason = str(exc).strip() or type(exc).__name__
        return IndexDamagedError(self.path, f"cannot be read by SQLite ({reason})")

    def _query(self, sql: str, parameters: Sequence) -> list:
        try:
            with self._lock:
                return self._connection.execute(sql, parameters).fetchall()
        except sqlite3.Error as exc:
            raise self._damaged(exc) from None

    def get(self, rows: Sequence[int]) -> dict[int, tuple[str, str]]:
        """Row number -> (id, text) for ``rows``.

        Raises:
            IndexDamagedError: SQLite cannot read the file (a page overwritten or lost after
                the index was opened), naming it.
        """
        if not len(rows):
            return {}
        marks = ",".join("?" * len(rows))
        found = self._query(
            f"SELECT row, id, text FROM texts WHERE row IN ({marks})",  # noqa: S608
            [int(r) for r in rows],
        )
        return {row: (ident, text) for row, ident, text in found}

    def all(self, rows: int | None = None) -> tuple[list[str], list[str]]:
        """(ids, texts) of rows 0 .. ``rows`` - 1 (default: every row), in row order."""
        limit = -1 if rows is None else int(rows)
        found = self._query("SELECT id, text FROM texts ORDER BY row LIMIT ?", (limit,))
        return [ident for ident, _ in found], [text for _, text in found]
