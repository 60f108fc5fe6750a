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
import logging
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..io import atomic_write, fsync_directory

log = logging.getLogger(__name__)

# The files of a committed index, by name: the pointer, a generation's, a segment's.
CURRENT = "CURRENT"
META = "meta.json"  # model, options, rows, segments and their offsets
GRAPH = "hnsw.usearch"  # the HNSW graph over every segment (a graph index only)
VECTORS = "vectors.npy"  # a segment's float32 unit vectors (n, d)
STORED = "stored.npy"  # a segment's int8 (n, d) or packed binary (n, d / 8) vectors
TEXTS = "texts.sqlite"  # a segment's rows, ids and texts
SEGMENT_RECORD = "segment.json"  # a segment's rows, content hash and source
FILE_KINDS = (CURRENT, META, GRAPH, VECTORS, STORED, TEXTS, SEGMENT_RECORD)

_GENERATION_NAME = re.compile(r"gen-[0-9]{6,}")
SEGMENT_NAME = re.compile(r"seg-[0-9a-f]{16}")


class IndexBusyError(RuntimeError):
    """Another process is building or adding to the index."""


class IndexDamagedError(ValueError):
    """A file of a committed index is missing, unreadable, or disagrees with ``meta.json``.

    The message names the file (and ``meta.json`` where the two disagree) and says how to
    recover: build the index again."""

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(
            f"{path} {problem}; the index is damaged: run the same `clearformer index build` "
            "again to rebuild it (or build into a new directory)"
        )
        self.path = path


def current_generation(root: Path) -> str | None:
    """The committed generation's name, or None when nothing was committed yet (no
    ``CURRENT``, or an empty one). IndexDamagedError if ``CURRENT`` names no generation."""
    path = root / CURRENT
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise IndexDamagedError(path, "is a directory, not a file naming a generation") from None
    try:
        name = data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise IndexDamagedError(
            path, "holds bytes that are not text, not a generation's name"
        ) from None
    if not name:
        return None
    if not _GENERATION_NAME.fullmatch(name):
        # Never a path: a name read from disk must not lead out of generations/.
        raise IndexDamagedError(path, f"holds {name[:40]!r}, not a generation's name (gen-NNNNNN)")
    return name


def generation_dir(root: Path, name: str) -> Path:
    return root / "generations" / name


def segment_dir(root: Path, name: str) -> Path:
    return root / "segments" / name


def stored_name(storage: str) -> str:
    """The file an exact scan or the graph's build reads: the float32 vectors themselves, or
    the int8 / binary copy."""
    return VECTORS if storage == "float32" else STORED


def index_files(root: Path, generation: str, meta: dict[str, Any]) -> list[Path]:
    """Every file the committed ``generation`` (whose ``meta.json`` is ``meta``) consists of,
    in the order :class:`~.vector_index.VectorIndex` checks them."""
    folder = generation_dir(root, generation)
    files = [root / CURRENT, folder / META]
    if meta["ann"] == "hnsw":
        files.append(folder / GRAPH)
    storage = meta["options"]["storage"]
    for segment in meta["segments"]:
        names = [VECTORS, TEXTS, SEGMENT_RECORD]
        if storage != "float32":
            names.insert(1, STORED)
        files += [segment_dir(root, segment["name"]) / name for name in names]
    return files


def next_generation_name(root: Path) -> str:
    numbers = [
        int(p.name.split("-")[1])
        for p in (root / "generations").glob("gen-*")
        if p.name.split("-")[1].isdigit()
    ]
    return f"gen-{max(numbers, default=0) + 1:06d}"


class JSONFileError(ValueError):
    """A JSON file of an index or a shard directory that is not valid UTF-8 JSON."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path} is not valid JSON ({reason})")
        self.path = path
        self.reason = reason


def read_json(path: Path) -> Any:
    """The JSON in ``path``; JSONFileError naming it if it holds none (OSError if unread)."""
    data = path.read_bytes()
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise JSONFileError(
            path, f"not UTF-8: byte {exc.start} is {data[exc.start]:#04x}"
        ) from None
    except json.JSONDecodeError as exc:
        raise JSONFileError(path, str(exc)) from None


def write_json(path: Path, data: dict[str, Any]) -> None:
    with atomic_write(path) as handle:
        json.dump(data, handle, indent=1, sort_keys=True)
        handle.write("\n")


@contextlib.contextmanager
def writer_lock(root: Path) -> Iterator[None]:
    """Hold ``INDEX``'s writer lock for one build or add; IndexBusyError if another process
    has it.

    The lock is taken on the index's directory itself, which cannot be removed while it holds
    the index, and on ``INDEX/.lock`` (what earlier versions lock, so that they and this one
    exclude each other). A lock is held on a file, not on its name: a ``.lock`` removed while
    a writer holds it would be made again, and a second writer would lock the new file; the
    directory's lock still excludes it.
    """
    root.mkdir(parents=True, exist_ok=True)
    directory = os.open(root, os.O_RDONLY)
    try:
        _lock(directory, root)
        with open(root / ".lock", "a+") as handle:
            _lock(handle.fileno(), root)
            yield
    finally:
        os.close(directory)  # closing the descriptors releases the locks


def _lock(descriptor: int, root: Path) -> None:
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            raise IndexBusyError(
                f"{root} is being written by another build or add; wait for it to finish"
            ) from None
        raise


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
        fsync_directory(temporary)  # its entries, before the rename publishes them
        os.rename(temporary, target)
        fsync_directory(target.parent)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise


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
        with contextlib.suppress(OSError, ValueError, AttributeError):
            previous = read_json(generation_dir(root, current) / META).get("previous")
            names.add(previous)
        kept = [g for g in generations if g.name in names]
        for stale in generations:
            if stale.name not in names:
                shutil.rmtree(stale, ignore_errors=True)
    else:
        kept = []
    used: set[str] = set()
    for generation in kept:
        try:
            used.update(s["name"] for s in read_json(generation / META)["segments"])
        except (OSError, ValueError, KeyError, TypeError):
            used = None  # a kept generation whose segments cannot be told: remove none
            break
    for segment in (root / "segments").glob("seg-*"):
        if used is not None and segment.name not in used:
            shutil.rmtree(segment, ignore_errors=True)
    for folder in (root / "generations", root / "segments"):
        for leftover in folder.glob(".*.tmp-*"):
            shutil.rmtree(leftover, ignore_errors=True)


def clear_staging(root: Path, job_key: str | None) -> None:
    """After a commit (the writer lock held, so no other write is staging): remove every
    job's chunks under ``root/staging``, the committed job's and those a stopped write of other
    texts left, which would otherwise stay on disk until that very write ran again (run again,
    it embeds its texts anew). The others are logged with their size."""
    staging = root / "staging"
    for job in sorted(staging.iterdir()) if staging.is_dir() else []:
        if job.name != job_key:
            size = sum(f.stat().st_size for f in job.rglob("*") if f.is_file())
            log.info("removing %s: chunks of a stopped write (%s bytes)", job, f"{size:,}")
        shutil.rmtree(job, ignore_errors=True)
