"""An index folder with several kinds over one corpus: one texts store, one sub-index per kind.

::

    INDEX/
      texts/texts.sqlite, texts.json    the corpus (rows, ids, texts), written once
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

The dense kind is a whole :class:`~.vector_index.VectorIndex` in ``dense/`` (which also keeps
its texts in its segments, as a dense index always does).
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

from . import integrity, layout
from .chunks import texts_sha256
from .texts import TextStore, write_texts

log = logging.getLogger(__name__)

KINDS = ("dense", "sparse", "multivector", "bm25")
TEXTS_DIR = "texts"
TEXTS_RECORD = "texts.json"
KIND_FORMAT = 1  # a sparse / multi-vector / bm25 generation's meta.json format


class KindNotFoundError(ValueError):
    """The index holds no sub-index of the kind a search or an option names."""


def content_hash(texts: list[str], ids: list[str]) -> str:
    """What the collection's texts are: the texts and their ids."""
    return texts_sha256([texts_sha256(texts), texts_sha256(ids)])


def is_collection(root: Path) -> bool:
    """Whether ``root`` is an index folder of kinds (not a dense index at its top)."""
    return (root / TEXTS_DIR).is_dir() or any((root / kind).is_dir() for kind in KINDS)


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
            if layout.current_generation(root / kind) is not None:
                present.append(kind)
        except layout.IndexDamagedError:
            present.append(kind)  # there, but damaged: opening it says which file
    return present


def require_kind(root: Path, kind: str, asked_by: str) -> None:
    """KindNotFoundError (one line, naming the kinds present) unless ``root`` holds ``kind``."""
    if kind not in KINDS:
        raise KindNotFoundError(f"{asked_by}: unknown kind {kind!r}; expected one of {KINDS}")
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
            f"{root} is a dense index built without --kind; give --kind indexes a new folder"
        )
    content = content_hash(texts, ids)
    folder = root / TEXTS_DIR
    with layout.writer_lock(root):
        record = None
        if folder.is_dir():
            try:
                _, record = open_texts(root)
            except layout.IndexDamagedError as exc:
                # Rewritten from this build's texts; a kind built from others then refuses to
                # open (its meta.json records their hash), so nothing is mixed silently.
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
    integrity.check_texts(folder / layout.TEXTS, record["rows"], folder / TEXTS_RECORD)
    return TextStore(folder / layout.TEXTS), record


def _read_texts_record(folder: Path) -> dict[str, Any]:
    path = folder / TEXTS_RECORD
    try:
        record = layout.read_json(path)
    except FileNotFoundError:
        raise layout.IndexDamagedError(path, "is missing (the texts store's record)") from None
    except (layout.JSONFileError, OSError) as exc:
        raise layout.IndexDamagedError(path, f"cannot be read ({exc})") from None
    if (
        not isinstance(record, dict)
        or not isinstance(record.get("rows"), int)
        or not isinstance(record.get("content"), str)
    ):
        raise layout.IndexDamagedError(path, "does not hold {rows, content}")
    return record


def kind_root(root: str | os.PathLike, kind: str) -> Path:
    return Path(root) / kind
