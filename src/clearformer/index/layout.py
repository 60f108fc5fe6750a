"""An index directory on disk: immutable segments, generations and a ``CURRENT`` pointer.

::

    INDEX/
      CURRENT                     the committed generation's name, replaced atomically
      generations/gen-000003/     meta.json (model, options, segments) and hnsw.usearch
      segments/seg-<key>/         vectors.npy (float32), stored.npy (int8 / binary),
                                  texts.sqlite, segment.json; never changed once written
      staging/<key>/              chunks of embeddings of a build or add not yet committed
      .lock                       held by the one writer (flock; the kernel frees it on death)

Every directory a writer makes is filled under a temporary name, flushed to disk and then
renamed into place, and a build or add becomes visible only when ``CURRENT`` is replaced
(:func:`clearformer.io.atomic_write`, an atomic rename). So a writer killed at any instant
leaves the previous generation whole and current, and a reader, which reads ``CURRENT`` once
and then only immutable files, never sees half an index. The generation before the current
one is kept, for readers that opened it just before a commit; older ones, and those of
writers killed before their commit, are removed.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..io import atomic_write

CURRENT = "CURRENT"


class IndexBusyError(RuntimeError):
    """Another process is building or adding to the index."""


def current_generation(root: Path) -> str | None:
    """The committed generation's name, or None when nothing was committed yet."""
    try:
        name = (root / CURRENT).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    return name or None


def generation_dir(root: Path, name: str) -> Path:
    return root / "generations" / name


def segment_dir(root: Path, name: str) -> Path:
    return root / "segments" / name


def next_generation_name(root: Path) -> str:
    numbers = [
        int(p.name.split("-")[1])
        for p in (root / "generations").glob("gen-*")
        if p.name.split("-")[1].isdigit()
    ]
    return f"gen-{max(numbers, default=0) + 1:06d}"


def read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def write_json(path: Path, data: dict[str, Any]) -> None:
    with atomic_write(path) as handle:
        json.dump(data, handle, indent=1, sort_keys=True)
        handle.write("\n")


@contextlib.contextmanager
def writer_lock(root: Path) -> Iterator[None]:
    """Hold ``INDEX/.lock`` for one build or add; IndexBusyError if another process has it."""
    root.mkdir(parents=True, exist_ok=True)
    handle = open(root / ".lock", "a+")  # noqa: SIM115 -- held for the block
    try:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                raise IndexBusyError(
                    f"{root} is being written by another build or add; wait for it to finish"
                ) from None
            raise
        yield
    finally:
        handle.close()  # closing the descriptor releases the lock


@contextlib.contextmanager
def new_directory(target: Path) -> Iterator[Path]:
    """A temporary directory beside ``target``, renamed onto it when the block succeeds
    (its files flushed first); removed on failure. ``target`` must not exist."""
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.parent / f".{target.name}.tmp-{os.getpid()}"
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir()
    try:
        yield temporary
        for path in temporary.iterdir():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
        os.rename(temporary, target)
        fsync_directory(target.parent)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise


def fsync_directory(path: Path) -> None:
    """Make a rename inside ``path`` durable (its directory entry is data too)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit(root: Path, generation: str) -> None:
    """Make ``generation`` the current one: one atomic replace of ``CURRENT``."""
    with atomic_write(root / CURRENT) as handle:
        handle.write(generation + "\n")
    fsync_directory(root)


def remove_stale(root: Path) -> None:
    """Remove generations older than the kept ones, segments no kept generation uses, and
    leftovers of killed writers (temporary directories). Call with the writer lock held."""
    current = current_generation(root)
    generations = sorted((root / "generations").glob("gen-*"), reverse=True)
    if current is not None:
        # The current generation and the one committed before it (its meta names it); any
        # other is older, or was written by a writer killed before its commit.
        names = {current}
        with contextlib.suppress(OSError, ValueError):
            previous = read_json(generation_dir(root, current) / "meta.json").get("previous")
            names.add(previous)
        kept = [g for g in generations if g.name in names]
        for stale in generations:
            if stale.name not in names:
                shutil.rmtree(stale, ignore_errors=True)
    else:
        kept = []
    used = set()
    for generation in kept:
        with contextlib.suppress(OSError, ValueError, KeyError):
            used.update(s["name"] for s in read_json(generation / "meta.json")["segments"])
    for segment in (root / "segments").glob("seg-*"):
        if segment.name not in used:
            shutil.rmtree(segment, ignore_errors=True)
    for folder in (root / "generations", root / "segments"):
        for leftover in folder.glob(".*.tmp-*"):
            shutil.rmtree(leftover, ignore_errors=True)
