"""Embeddings computed in chunks, each committed to disk once: the unit of resumption.

A corpus is cut into chunks of ``chunk_rows`` consecutive texts (chunk i holds rows
``i * chunk_rows`` up to the next chunk's first row). Each chunk's embeddings are written to
``chunk-<i>.npy`` atomically (temporary file, flush, rename), so a chunk file either holds all
of its rows or does not exist. A process killed part-way leaves the chunks it finished; run
again, it encodes only the others. The cut depends on the corpus alone, never on how many
processes share the work, so a run resumed with another number of processes reuses them too.

``job.json`` in the chunk directory names what the chunks are embeddings of (the texts' hash,
the model's identity, normalisation, precision, chunk size); chunks of another job are never
mixed in: a directory that holds another job's chunks is refused.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..checks import check_finite_rows
from ..io import atomic_write
from .layout import JSONFileError, read_json, write_json

log = logging.getLogger(__name__)

ChunkDone = Callable[[int, bool], None]  # (chunk index, reused) after each chunk


def chunk_progress(progress: Any, start: int, total: int) -> Any:
    """``encode``'s ``progress`` for the chunk starting at row ``start``: a callable reports
    rows of the whole corpus, ``(start + done, total)``; other values go as they are."""
    if not callable(progress):
        return progress
    return lambda done, _: progress(start + done, total)


class ChunkJobMismatch(ValueError):
    """A chunk directory holds the chunks of another job."""


def texts_sha256(texts: Sequence[str]) -> str:
    """SHA-256 of a list of texts (each text's UTF-8 bytes, length-prefixed: no two lists
    share one)."""
    digest = hashlib.sha256()
    for text in texts:
        data = text.encode("utf-8")
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


def chunk_count(rows: int, chunk_rows: int) -> int:
    return (rows + chunk_rows - 1) // chunk_rows


class ChunkStore:
    """The chunk files of one job in ``directory``.

    Args:
        directory: where the chunks live (made if missing).
        job: what the chunks are (JSON-able); a directory holding another job is refused.
    """

    def __init__(self, directory: Path, job: dict[str, Any]) -> None:
        self.directory = directory
        self.job = job
        directory.mkdir(parents=True, exist_ok=True)
        record = directory / "job.json"
        if record.is_file():
            try:
                found = read_json(record)
            except JSONFileError as exc:
                raise ChunkJobMismatch(
                    f"{record} is damaged ({exc.reason}): the chunks beside it cannot be told "
                    f"to be this job's; remove {directory} and run again to embed them anew"
                ) from None
            if not isinstance(found, dict):
                raise ChunkJobMismatch(
                    f"{record} holds a JSON {type(found).__name__}, not a job's object: the "
                    f"chunks beside it cannot be told to be this job's; remove {directory} and "
                    "run again to embed them anew"
                )
            if found != job:
                differ = sorted(k for k in set(found) | set(job) if found.get(k) != job.get(k))
                raise ChunkJobMismatch(
                    f"{directory} holds the chunks of another job (it differs in "
                    f"{', '.join(differ)}); use another output or remove that directory"
                )
        else:
            write_json(record, job)

    def path(self, index: int) -> Path:
        return self.directory / f"chunk-{index:06d}.npy"

    def done(self, index: int) -> bool:
        """Whether chunk ``index`` is committed and whole. A damaged chunk file (cut short,
        overwritten, or of another row count: a chunk is written atomically, so only something
        else damages it) is removed, to be embedded again."""
        path = self.path(index)
        if not path.is_file():
            return False
        problem = self._problem(index)
        if problem is not None:
            log.warning("%s %s: embedding that chunk again", path, problem)
            path.unlink(missing_ok=True)
            return False
        return True

    def _problem(self, index: int) -> str | None:
        from .integrity import array_problem

        rows, chunk_rows = self.job.get("rows"), self.job.get("chunk_rows")
        if not isinstance(rows, int) or not isinstance(chunk_rows, int):
            return None  # a job that does not say: nothing to hold the file to
        expected = min(chunk_rows, rows - index * chunk_rows)
        try:
            problem = array_problem(
                self.path(index), expected, None, "float32", self.directory / "job.json"
            )
        except FileNotFoundError:
            return "is missing"
        if problem is not None:
            return problem
        vectors = self.read(index)
        with np.errstate(over="ignore", invalid="ignore"):  # garbage may overflow
            norms = np.linalg.norm(vectors, axis=1)  # (rows,)
        bad = ~np.isfinite(norms)
        if self.job.get("normalize"):  # unit rows (a text's embedding may be zero, no more)
            bad |= (np.abs(norms - 1) > 1e-3) & (norms != 0)
        if bad.any():
            return f"holds row {int(np.argmax(bad))}, which is not a finite" + (
                " unit vector" if self.job.get("normalize") else " vector"
            )
        return None

    def row_values(self, vectors: Any) -> np.ndarray:
        """(n, k): what must be finite in each of a chunk's n rows (here the rows themselves)."""
        return np.asarray(vectors)

    def write(self, index: int, vectors: Any) -> None:
        with atomic_write(self.path(index), "wb") as handle:
            np.save(handle, np.asarray(vectors, dtype=np.float32))

    def read(self, index: int, mmap: bool = False) -> np.ndarray:
        return np.load(self.path(index), mmap_mode="r" if mmap else None)


def embed_chunks(
    encode: Callable[[list[str], int], np.ndarray],
    texts: Sequence[str],
    store: ChunkStore,
    chunk_rows: int,
    chunks: Sequence[int] | None = None,
    on_chunk: ChunkDone | None = None,
    consequence: str = "that chunk was not committed and the index was not changed",
) -> tuple[int, int]:
    """Embed every chunk of ``texts`` (or only ``chunks``) that ``store`` lacks.

    A chunk holding a NaN or an infinity is refused before it is committed (ValueError naming
    the texts, and ``consequence``, what was left undone): a committed chunk is reused by every
    later run, and such a row scores nothing it is compared with.

    Args:
        encode: (texts, row of the first) -> what ``store.write`` takes: (n, D) float32
            embeddings for a :class:`ChunkStore`, named arrays for an
            :class:`~.ragged_chunks.RaggedChunkStore`.
        chunks: the chunk indices this process owns; None = all.

    Returns:
        (chunks encoded, chunks reused).
    """
    every = range(chunk_count(len(texts), chunk_rows))
    chunks = every if chunks is None else chunks
    encoded = reused = 0
    for index in chunks:
        if store.done(index):
            reused += 1
            if on_chunk is not None:
                on_chunk(index, True)
            continue
        start = index * chunk_rows
        chunk = list(texts[start : start + chunk_rows])
        vectors = encode(chunk, start)
        check_finite_rows(
            store.row_values(vectors),
            chunk,
            start=start,
            total=len(texts),
            consequence=consequence,
        )
        store.write(index, vectors)  # the store decides the file's form
        encoded += 1
        if on_chunk is not None:
            on_chunk(index, False)
    if reused:
        log.info("reused %d committed chunk(s) of %s", reused, store.directory)
    return encoded, reused
