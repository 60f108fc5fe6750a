"""A texts store whose record (``texts/texts.json``) is damaged, told again from its databases.

The record is the store's one small mutable file; the databases beside it are written once and
never changed, and an add's database is named by its content (``texts-<content[:16]>.sqlite``).
So a lost record can be written again without losing a row:

* a build given texts and ids finds the database holding exactly them and names it;
* a build given none (``index build --kind K`` without ``--corpus``) takes the newest whole
  database, the one with the most rows (an add only appends);
* a kind an add has not reached yet (an add stopped part-way) keeps opening: its recorded rows
  and hash become one of the record's earlier states again when the texts begin with them.

A build given other texts than a whole database holds is refused, as it is with the record
intact (the kinds were built over those texts); where no database is whole, the store is
written anew from the build's texts.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Any

from . import integrity, layout
from .texts import TextStore
from .texts_record import (
    _TEXTS_FILE,
    KINDS,
    TEXTS_DIR,
    TEXTS_RECORD,
    _read_texts_record,
    content_hash,
)

log = logging.getLogger(__name__)


def record_damaged(root: Path) -> bool:
    """Whether ``root``'s texts store has a folder but a missing or unreadable record."""
    folder = root / TEXTS_DIR
    if not folder.is_dir():
        return False
    try:
        _read_texts_record(folder)
    except layout.IndexDamagedError:
        return True
    return False


def repair_plan(root: Path, texts: list[str], ids: list[str]) -> str | None:
    """For a damaged record: the newest whole database (the most rows), where it holds
    exactly ``texts`` and ``ids`` (the record is written again naming it), or None where no
    database is whole (the store is written anew from them). ValueError, nothing changed,
    where the newest holds other texts, or more rows after these (the first corpus after an
    add): the folder's kinds were built over its rows, as an intact record would have said."""
    content = content_hash(texts, ids)
    whole = _whole_databases(root / TEXTS_DIR)
    if not whole:
        return None
    # An add only appends: the database with the most rows is the store's newest state, and
    # the only one a record may name. An earlier one (the first corpus after an add) would
    # roll the store back, and every kind holding the added rows would stop opening.
    rows = max(len(found[2]) for found in whole)
    newest = [found for found in whole if len(found[2]) == rows]
    for name, held_ids, held_texts in newest:
        if content_hash(held_texts, held_ids) == content:
            return name
    newest, newest_ids, newest_texts = newest[-1]
    record = root / TEXTS_DIR / TEXTS_RECORD
    earlier = (
        len(texts) < rows
        and content_hash(newest_texts[: len(texts)], newest_ids[: len(texts)]) == content
    )
    held = (
        f"holds these {len(texts):,} rows and {rows - len(texts):,} added after them"
        if earlier
        else f"holds other texts ({rows:,} rows) than this build's ({len(texts):,} rows)"
    )
    raise ValueError(
        f"{record} is damaged, and {root / TEXTS_DIR / newest} {held}: build without --corpus "
        "(over the texts the folder holds) to write it again, or build into another folder"
    )


def rewrite_record(root: Path, texts: list[str], ids: list[str]) -> dict[str, Any] | None:
    """Write a damaged record again (:func:`repair_plan`); the new record, or None where no
    database holds these texts. Call with ``root``'s writer lock held."""
    name = repair_plan(root, texts, ids)
    if name is None:
        return None
    record: dict[str, Any] = {"rows": len(texts), "content": content_hash(texts, ids)}
    if name != layout.TEXTS:
        record["file"] = name
    prefixes = _earlier_states(root, texts, ids)
    if prefixes:
        record["prefixes"] = prefixes
    folder = root / TEXTS_DIR
    layout.write_json(folder / TEXTS_RECORD, record)
    layout.fsync_directory(folder)
    log.warning("wrote %s again: it names %s", folder / TEXTS_RECORD, name)
    return record


def held_texts(root: Path) -> tuple[list[str], list[str]]:
    """(ids, texts) of the newest whole database of a store whose record is damaged.
    ValueError where that cannot be told: no whole database, or a damaged one of an add
    (it may have been the newest)."""
    folder = root / TEXTS_DIR
    names = sorted(p.name for p in folder.iterdir() if _TEXTS_FILE.fullmatch(p.name))
    whole = _whole_databases(folder)
    damaged = sorted(set(names) - {name for name, _, _ in whole} - {layout.TEXTS})
    if not whole or damaged:
        which = f"{folder / damaged[0]} is damaged too" if damaged else "no database is whole"
        raise ValueError(
            f"{folder / TEXTS_RECORD} is damaged and {which}: the texts {root} holds cannot be "
            "told; build with --corpus giving all of them (texts and ids, in row order), or "
            "build into a new folder"
        )
    _, ids, texts = max(whole, key=lambda found: len(found[2]))
    return ids, texts


def _whole_databases(folder: Path) -> list[tuple[str, list[str], list[str]]]:
    """(name, ids, texts) of each database in ``folder`` that SQLite reads whole (an add's,
    only where its rows are the content its name says)."""
    found = []
    for path in sorted(folder.iterdir()):
        if not _TEXTS_FILE.fullmatch(path.name):
            continue
        try:
            first, last = integrity.texts_row_range(path)
            rows = 0 if last is None else last + 1
            integrity.check_texts(path, rows, folder / TEXTS_RECORD)
            ids, texts = TextStore(path).all(rows)
        except (layout.IndexDamagedError, sqlite3.Error, OSError):
            continue
        if len(texts) != rows:  # rows missing between the first and the last
            continue
        if path.name != layout.TEXTS and content_hash(texts, ids)[:16] != path.name[6:22]:
            continue
        found.append((path.name, ids, texts))
    return found


def _earlier_states(root: Path, texts: list[str], ids: list[str]) -> list[dict[str, Any]]:
    """The rows and hashes the committed kinds record that are a state before these texts'
    (a kind an add has not reached), checked against the texts' first rows."""
    states = []
    for kind in KINDS[1:]:  # the dense kind keeps its own texts and records no such hash
        sub = root / kind
        try:
            generation = layout.current_generation(sub)
            if generation is None:
                continue
            meta = layout.read_json(layout.generation_dir(sub, generation) / layout.META)
            rows, content = meta["rows"], meta["texts"]
        except (layout.IndexDamagedError, layout.JSONFileError, OSError, KeyError, TypeError):
            continue  # a damaged kind is rebuilt; it holds no state to keep
        state = {"rows": rows, "content": content}
        earlier = isinstance(rows, int) and 0 <= rows < len(texts) and state not in states
        if earlier and content_hash(texts[:rows], ids[:rows]) == content:
            states.append(state)
    return sorted(states, key=lambda state: state["rows"])
