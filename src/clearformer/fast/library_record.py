"""The record of a built kernel library: its size and SHA-256, written beside it once the
build is on disk, and checked before the library is ever loaded.

The dynamic loader maps a library file as it finds it: one cut short (a power loss between a
rename and the data's flush, a full disk) kills the process with SIGBUS at the first page past
its end, and one damaged otherwise may load and misbehave. A library is loaded only where it
matches the record of its build.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from ..io import atomic_write, fsync_directory


def record_path(library: Path) -> Path:
    """The record of what the build of ``library`` wrote: its size and SHA-256."""
    return library.with_suffix(".record")


def digest(path: Path) -> dict:
    """``path``'s size and SHA-256, as its record holds them."""
    sha = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            sha.update(chunk)
        size = handle.tell()
    return {"size": size, "sha256": sha.hexdigest()}


def publish(partial: Path, library: Path) -> None:
    """Move the finished build ``partial`` onto ``library`` and record it. On disk before the
    name points at it: a crash after the rename must not leave a library whose pages were
    never written."""
    with open(partial, "rb") as handle:
        os.fsync(handle.fileno())
    record = digest(partial)
    os.replace(partial, library)
    with atomic_write(record_path(library)) as handle:  # fsynced, then renamed
        json.dump(record, handle)
    fsync_directory(library.parent)


def fault(library: Path) -> str | None:
    """What is wrong with ``library`` ("is not built" where there is none yet), None where
    it matches the record of its build. Read before any load."""
    if not library.exists():
        return "is not built"
    try:
        record = json.loads(record_path(library).read_text(encoding="utf-8"))
        wanted = {"size": int(record["size"]), "sha256": str(record["sha256"])}
    except FileNotFoundError:
        return "has no record of its build (a build that stopped, or an older clearformer's)"
    except (OSError, ValueError, TypeError, KeyError) as error:
        return f"has a damaged record of its build ({error})"
    try:
        found = digest(library)
    except OSError as error:
        return f"cannot be read ({error})"
    if found["size"] != wanted["size"]:
        return f"holds {found['size']} bytes where its build wrote {wanted['size']}"
    if found["sha256"] != wanted["sha256"]:
        return "differs from what its build wrote (SHA-256)"
    return None


def discard(library: Path) -> None:
    """Remove ``library`` and its record (the caller holds the build lock)."""
    library.unlink(missing_ok=True)
    record_path(library).unlink(missing_ok=True)
