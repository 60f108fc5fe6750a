"""The texts store's record (``texts/texts.json``) and its databases' names: what a folder of
kinds (:mod:`.collection`) and the record's repair (:mod:`.texts_repair`) both read."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from . import layout
from .chunks import texts_sha256

KINDS = ("dense", "sparse", "multivector", "bm25")
TEXTS_DIR = "texts"
TEXTS_RECORD = "texts.json"
# The texts store's databases: the build's texts.sqlite, an add's texts-<content[:16]>.sqlite
_TEXTS_FILE = re.compile(r"texts(-[0-9a-f]{16})?\.sqlite")


def content_hash(texts: list[str], ids: list[str]) -> str:
    """What the collection's texts are: the texts and their ids."""
    return texts_sha256([texts_sha256(texts), texts_sha256(ids)])


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
    for key in ("file", "previous_file"):
        name = record.get(key, layout.TEXTS)
        if not isinstance(name, str) or not _TEXTS_FILE.fullmatch(name):
            raise layout.IndexDamagedError(path, f"names {key} {name!r:.60}, not a texts database")
    prefixes = record.get("prefixes", [])
    if not isinstance(prefixes, list) or not all(
        isinstance(p, dict) and isinstance(p.get("rows"), int) and isinstance(p.get("content"), str)
        for p in prefixes
    ):
        raise layout.IndexDamagedError(path, "holds prefixes that are not {rows, content} records")
    return record
