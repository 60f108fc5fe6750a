"""An index folder with several kinds over one corpus: one texts store, one sub-index per kind.

::

    INDEX/
      texts/texts.json                  the corpus's record: rows, content hash, its database
      texts/texts.sqlite                the corpus (rows, ids, texts) as the first build wrote it;
                                        an add writes texts-<content>.sqlite beside it
      dense/                            a dense index (:mod:`.layout`: CURRENT, generations, ...)
      sparse/ multivector/ bm25/        CURRENT, generations/gen-N/ (meta.json and the
                                        engine's files), staging/<job>/ (chunks), .lock
      .lock                             held while the texts store is written or checked

The texts are the collection's identity: the first build of any kind writes them; a build of
another kind over the same folder checks that it is given the same texts and ids (their
SHA-256) and refuses otherwise, before any encoding. Every kind's sub-index keeps the dense
index's crash safety: its files are written into a new generation directory under a
temporary name, and the kind becomes visible only when its ``CURRENT`` is replaced; a killed
build leaves the previous generation current and resumes from its committed chunks.

An add (:mod:`.kinds_add`) only appends: it writes a new database (a copy of the current one
with the new rows) and then replaces ``texts.json``, which names it and keeps each earlier
state's rows and content hash (``prefixes``). Rows never change once written, so a kind
committed at an earlier state reads its rows from the newer database; the database the
previous record named is kept for readers that opened it before the replace.

The dense kind is a whole :class:`~.vector_index.VectorIndex` in ``dense/`` (which also keeps
its texts in its segments, as a dense index always does).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

from . import integrity, layout
from .texts import TextStore, append_texts, write_texts
from .texts_record import (  # noqa: F401 (KINDS, TEXTS_DIR: this module's names too)
    _TEXTS_FILE,
    KINDS,
    TEXTS_DIR,
    TEXTS_RECORD,
    _read_texts_record,
    content_hash,
)

log = logging.getLogger(__name__)

KIND_FORMAT = 1  # a sparse / multi-vector / bm25 generation's meta.json format
# layout.new_directory's temporary of texts/: a first build killed before renaming it leaves it
# (with the writer lock) at the folder's top, and no later build of that process removes it.
_TEXTS_LEFTOVER = re.compile(r"\.texts\.tmp-[0-9]+")
_LOCK = ".lock"


class KindNotFoundError(ValueError):
    """The index holds no sub-index of the kind a search or an option names."""


class KindsDisagreeError(ValueError):
    """The kinds of a folder hold different rows: an add stopped between two kinds' commits
    (the same add again finishes it)."""


def is_collection(root: Path) -> bool:
    """Whether ``root`` is an index folder of kinds (not a dense index at its top)."""
    return (root / TEXTS_DIR).is_dir() or any((root / kind).is_dir() for kind in KINDS)


def holds_only_leftovers(root: Path) -> bool:
    """Whether the folder ``root`` holds nothing but what a first build killed before its
    texts store was renamed into place leaves (the writer lock, temporaries of ``texts/``):
    such a folder counts as empty, and a build there resumes."""
    return all(p.name == _LOCK or _TEXTS_LEFTOVER.fullmatch(p.name) for p in root.iterdir())


def remove_texts_leftovers(root: Path) -> None:
    """Remove the temporaries of ``texts/`` killed builds left. Call with ``root``'s writer
    lock held: only its holder fills such a temporary, so none is in use."""
    for path in root.iterdir():
        if _TEXTS_LEFTOVER.fullmatch(path.name):
            log.info("removing %s: the texts store of a stopped build", path)
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)


def kinds_present(root: Path) -> list[str]:
    """The kinds with a committed sub-index in ``root``, in :data:`KINDS` order; a plain
    dense index (built without ``--kind``) counts as ``dense``."""
    if not is_collection(root):
        try:
            return ["dense"] if layout.current_generation(root) is not None else []
        except layout.IndexDamagedError:
            return ["dense"]
    present = []
    for kind in KINDS:
        try:
            if kind_generation(root / kind) is not None:
                present.append(kind)
        except layout.IndexDamagedError:
            present.append(kind)  # there, but damaged: opening it says which file
    return present


def kind_generation(sub: Path) -> str | None:
    """The committed generation of the kind folder ``sub`` (None: no such kind, or none of
    its builds got as far as writing a generation). IndexDamagedError naming the file where
    ``sub`` is a file, or where its ``CURRENT`` is missing or empty while generations remain:
    the kind was committed and its pointer lost, and left out in silence it would change
    what a hybrid search fuses. (A first build killed between its generation and its commit
    looks the same; running it again is the remedy for both.)"""
    if sub.exists() and not sub.is_dir():
        raise layout.IndexDamagedError(
            sub, f"is a file, not the {sub.name} index's folder (remove it first)"
        )
    generation = layout.current_generation(sub)
    if generation is None:
        written = sorted(p.name for p in (sub / "generations").glob("gen-*"))
        if written:
            raise layout.IndexDamagedError(
                sub / layout.CURRENT,
                f"is missing or empty, but {sub / 'generations'} holds {', '.join(written)}",
            )
    return generation


def require_kind(root: Path, kind: str, asked_by: str) -> None:
    """KindNotFoundError (one line, naming the kinds present) unless ``root`` holds ``kind``."""
    if kind not in KINDS:
        raise KindNotFoundError(f"{asked_by}: unknown kind {kind!r}; expected one of {KINDS}")
    if is_collection(root):
        kind_generation(root / kind)  # a damaged pointer is named, not taken for no kind
    present = kinds_present(root)
    if kind not in present:
        holds = ", ".join(present) if present else "no kind"
        raise KindNotFoundError(
            f"{asked_by}: index {root} holds no {kind} index (it holds {holds}); build one "
            f"with `clearformer index build --kind {kind} --out {root}`"
        )


def ensure_texts(root: Path, texts: list[str], ids: list[str]) -> str:
    """Write the collection's texts store, or check it holds exactly ``texts`` and ``ids``;
    their content hash. ValueError if the folder holds other texts (nothing is changed); a
    damaged store is written again."""
    if (root / layout.CURRENT).exists() and not is_collection(root):
        raise ValueError(
            f"{root} is a dense index built on its own (without a kind): a sparse, "
            "multi-vector or BM25 index goes into a folder of kinds, at another path"
        )
    for kind in KINDS:  # no build can write a kind where a file stands
        if (root / kind).exists() and not (root / kind).is_dir():
            raise ValueError(
                f"{root / kind} is a file, not the {kind} index's folder: remove it, or build "
                "into another folder"
            )
    content = content_hash(texts, ids)
    folder = root / TEXTS_DIR
    with layout.writer_lock(root):
        remove_texts_leftovers(root)
        record = None
        if folder.is_dir():
            try:
                _, record = open_texts(root)
            except layout.IndexDamagedError as exc:
                from . import texts_repair

                # A lost record is told again from the databases (ValueError where they hold
                # other texts). A damaged database is written again from this build's texts: a
                # kind built from others then refuses to open (its meta.json records their
                # hash), so nothing is mixed silently.
                if texts_repair.record_damaged(root):
                    record = texts_repair.rewrite_record(root, texts, ids)
                if record is None:
                    log.warning("%s; writing the texts store again", exc)
                    shutil.rmtree(folder)
        if record is not None:
            if record["content"] != content or record["rows"] != len(texts):
                raise ValueError(
                    f"{root} holds an index of other texts ({record['rows']:,} rows, "
                    f"content {record['content'][:12]}); these are {len(texts):,} rows, content "
                    f"{content[:12]}: build into another folder"
                )
            return content
        with layout.new_directory(folder) as temporary:
            write_texts(temporary / layout.TEXTS, ids, texts)
            layout.write_json(temporary / TEXTS_RECORD, {"rows": len(texts), "content": content})
        log.info("wrote the texts store of %s (%s rows)", root, f"{len(texts):,}")
    return content


def open_texts(root: Path) -> tuple[TextStore, dict[str, Any]]:
    """The collection's texts, checked (:class:`~.layout.IndexDamagedError` naming the file)."""
    folder = root / TEXTS_DIR
    record = _read_texts_record(folder)
    path = folder / texts_file(record)
    integrity.check_texts(path, record["rows"], folder / TEXTS_RECORD)
    return TextStore(path), record


def texts_file(record: dict[str, Any]) -> str:
    """The database a texts record names (a store no add has written: ``texts.sqlite``)."""
    return record.get("file", layout.TEXTS)


def check_dense_holds_store(root: Path, index: Any) -> None:
    """IndexDamagedError unless the dense kind ``index`` of the folder of kinds ``root`` holds
    the texts store's rows: its last write records the store's hash it was made with (a
    dense kind written before it did is taken as it is). The dense kind keeps its own texts,
    so nothing else ties its rows to the store the other kinds and the fused results read."""
    content = index.meta["segments"][-1].get("source", {}).get("texts_store")
    if content is None:
        return
    _, record = open_texts(root)
    if not holds_state(record, index.rows, content):
        meta = layout.generation_dir(root / "dense", index.generation) / layout.META
        raise layout.IndexDamagedError(
            meta,
            f"records texts {content[:12]} of {index.rows} rows, but {root / TEXTS_DIR} holds "
            f"{record['content'][:12]} of {record['rows']} rows",
        )


def holds_state(record: dict[str, Any], rows: int, content: str | None) -> bool:
    """Whether the store's first ``rows`` rows are the texts of hash ``content``: its current
    state, or one it had before an add (an add only appends, so that state is a prefix)."""
    states = [record, *record.get("prefixes", [])]
    return any(state["rows"] == rows and state["content"] == content for state in states)


def extend_texts(root: Path, record: dict[str, Any], ids: list[str], texts: list[str]) -> dict:
    """Make the store hold ``texts`` and ``ids`` (its own rows first, then the new ones); its
    new record. The caller holds ``root``'s writer lock.

    The new rows go into a copy of the database under a temporary name, renamed to its
    content's name; the store holds them once :func:`commit_texts` replaces ``texts.json``.
    Killed before that, the store is as it was (the orphan file is removed by the next add)."""
    folder = root / TEXTS_DIR
    first = record["rows"]
    content = content_hash(texts, ids)
    name = f"texts-{content[:16]}.sqlite"
    temporary = folder / f".{name}.tmp-{os.getpid()}"
    temporary.unlink(missing_ok=True)
    try:
        append_texts(folder / texts_file(record), temporary, first, ids[first:], texts[first:])
        os.replace(temporary, folder / name)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    layout.fsync_directory(folder)
    prefixes = [*record.get("prefixes", []), {"rows": first, "content": record["content"]}]
    new = {
        "rows": len(texts),
        "content": content,
        "file": name,
        "previous_file": texts_file(record),
        "prefixes": prefixes,
    }
    commit_texts(root, new)
    log.info("the texts store of %s holds %s rows (%s added)", root, f"{len(texts):,}",
             f"{len(texts) - first:,}")  # fmt: skip
    remove_stale_texts(root, new)
    return new


def commit_texts(root: Path, record: dict[str, Any]) -> None:
    """Replace ``texts.json`` (atomically): the texts store's commit."""
    folder = root / TEXTS_DIR
    layout.write_json(folder / TEXTS_RECORD, record)
    layout.fsync_directory(folder)


def remove_stale_texts(root: Path, record: dict[str, Any]) -> None:
    """Remove the databases ``record`` names neither as its own nor as the previous one, and
    what killed writers left. Call with ``root``'s writer lock held."""
    folder = root / TEXTS_DIR
    keep = {texts_file(record), record.get("previous_file")}
    for path in folder.iterdir():
        stale = _TEXTS_FILE.fullmatch(path.name) is not None and path.name not in keep
        leftover = path.name.startswith(".") and ".tmp" in path.name
        if stale or leftover:
            path.unlink(missing_ok=True)


def kind_root(root: str | os.PathLike, kind: str) -> Path:
    return Path(root) / kind
