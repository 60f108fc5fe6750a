"""A corpus embedded by several processes: one shard per rank and a manifest.

``torchrun --nproc_per_node=N -m clearformer encode --input CORPUS --output DIR`` starts N
processes; each reads the corpus, embeds its share and writes ``DIR/shard-<rank>-of-<N>.npy``
(or ``.parquet``). The share is a run of whole chunks (:mod:`.chunks`): with K chunks, rank r
takes chunks ``r * K // N`` up to ``(r + 1) * K // N``, so the shards in rank order are the
corpus's rows in order, each row in exactly one shard, and a one-process run gives the same
rows (a text's embedding does not depend on its batch-mates).

No process group is needed: ranks share nothing but the directory (on several nodes, a
shared file system). Each rank, its shard written, records it in ``shard-<rank>-of-<N>.json``;
the rank that finds every shard recorded writes ``manifest.json`` (rows, checksums, the
model's identity) and removes the chunks (a run that finds the manifest complete removes any
that a kill right after the manifest left). A killed run leaves its committed chunks in
``DIR/.chunks``; run again (with any number of processes) it encodes only the others. A rank
whose shard the killed run had already written and recorded keeps it and reads no chunk: so
the rank that writes the manifest may remove the chunks at once, since every rank it counted
has finished with them, whichever run it belongs to. A directory whose manifest already
describes this job is left as it is.

A row's embedding does not depend on the rank that computes it, nor on what that process
computed before: each chunk is one ``encode`` call of its own rows (its batches cut from those
rows alone), and every rank reorders its weights as one ``encode`` call of the whole corpus
would (:func:`~.reordering.reorder_as_one_call`): kept reordered from the first chunk on
(:meth:`~clearformer.TextEncoder.keep_weights_reordered`) when the corpus carries
``REORDER_MIN_TOKENS`` tokens, plain for every chunk when it does not; so every chunk takes the
same products. The shards of N processes are therefore the bytes of a one-process run's, and
of a one-process ``clearformer encode --output FILE.npy``, at the same thread count per process
(see docs/index.md for the thread count).

Each chunk's embeddings are checked to be finite before the chunk is committed, so no run
writes or reuses a NaN row. A directory whose manifest names a shard that is missing or
damaged is refused: its chunks were removed once the manifest was written.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..index.chunks import ChunkStore, chunk_count, chunk_progress, embed_chunks, texts_sha256
from ..index.identity import ModelIdentity, file_sha256
from ..index.layout import write_json
from ..index.recipe import computed_prompt
from ..io import atomic_write
from .directory import CHUNKS, MANIFEST, read_object, record_path, remove_leftovers
from .reordering import reorder_as_one_call

log = logging.getLogger(__name__)

SHARD_FORMATS = ("npy", "parquet")
# What the manifest keeps of each shard's record; "bytes" lets a rerun check a shard's size
# before its checksum.
SHARD_ENTRY = ("file", "rank", "rows", "count", "bytes", "sha256")


@dataclass(frozen=True)
class ShardResult:
    """What one rank did."""

    rank: int
    world: int
    file: str | None  # the shard's file name; None when the manifest was already complete
    rows: tuple[int, int]  # [start, stop) of the corpus
    encoded: int  # chunks embedded by this run
    reused: int  # chunks a killed run had committed
    manifest: bool  # this rank wrote the manifest
    reused_chunks: tuple[int, ...] = ()  # which chunks were reused, in order
    kept: bool = False  # a killed run had written and recorded this rank's shard: kept as is
    # Leftovers of an earlier run of this job (chunks, shards of another world size, killed
    # writes' temporary files), removed by this rank.
    cleaned: list[str] = field(default_factory=list)


def launch_rank() -> tuple[int, int]:
    """(rank, world size) from the launcher's environment (torchrun sets ``RANK`` and
    ``WORLD_SIZE``); (0, 1) without one."""
    try:
        rank = int(os.environ.get("RANK", "0"))
        world = int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        raise ValueError(
            f"RANK and WORLD_SIZE must be integers, got RANK={os.environ.get('RANK')!r} "
            f"WORLD_SIZE={os.environ.get('WORLD_SIZE')!r}"
        ) from None
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"expected 0 <= RANK < WORLD_SIZE, got RANK={rank} WORLD_SIZE={world}")
    return rank, world


def rank_chunks(rows: int, chunk_rows: int, rank: int, world: int) -> range:
    """The chunks rank ``rank`` of ``world`` embeds: a contiguous run of whole chunks."""
    total = chunk_count(rows, chunk_rows)
    return range(rank * total // world, (rank + 1) * total // world)


def shard_name(rank: int, world: int, fmt: str) -> str:
    return f"shard-{rank:05d}-of-{world:05d}.{fmt}"


def encode_shard(
    texts: Sequence[str],
    out: Path,
    encoder,
    *,
    rank: int = 0,
    world: int = 1,
    chunk_rows: int = 4096,
    fmt: str = "npy",
    normalize: bool | None = None,
    precision: str = "float32",
    source: dict[str, Any] | None = None,
    on_chunk: Callable[[int, bool], None] | None = None,
    **encode_options: Any,
) -> ShardResult:
    """Embed rank ``rank``'s share of ``texts`` into ``out`` (see the module docstring).

    Args:
        encoder: a :class:`~clearformer.TextEncoder`, loaded once by this process.
        fmt: ``"npy"`` (the (n, D) float32 array) or ``"parquet"`` (columns ``row``,
            ``text``, ``embedding``; needs pyarrow).
        normalize, precision: as ``encoder.encode``; they are part of the job, the precision
            as this machine resolves it (``"auto"`` is recorded as what it chose), and so are
            the encoder's attention backend and device type.
        encode_options: ``batch_size``, ``max_tokens``, ``workers``, ``progress`` (a callable
            is told the rows of the corpus done, reused chunks included), ``prompt`` and
            ``prompt_name`` (the prompt they put before each text is part of the job).
        on_chunk: called with (chunk index, reused) as each of this rank's chunks is
            committed or found committed.

    Raises:
        ValueError: a chunk's embeddings hold NaN or infinity (nothing of that chunk is
            committed); ``out`` holds another job, or a manifest that names a missing or
            damaged shard, or a record or manifest that is not a JSON object.
    """
    if fmt not in SHARD_FORMATS:
        raise ValueError(f"shard format must be one of {SHARD_FORMATS}, got {fmt!r}")
    if fmt == "parquet":
        _pyarrow()  # before any work
    if not texts:
        raise ValueError("no texts to encode")
    identity = ModelIdentity.of(encoder)
    normalize = encoder.normalize if normalize is None else bool(normalize)
    # The precision the rows are computed in, not the one asked for: "auto" (or an alias) may
    # resolve otherwise on another machine, whose chunks must then not pass for this job's.
    precision = encoder.precision_for(precision).choice
    job = {
        "texts": texts_sha256(texts),
        "rows": len(texts),
        "model": identity.revision,
        "pooling": identity.pooling,
        "max_length": identity.max_length,
        "normalize": normalize,
        "precision": precision,
        "chunk_rows": chunk_rows,
        # Another attention backend or device may round otherwise: a run resumed with them
        # must not mix its rows with these (auto is recorded as auto: it decides per batch
        # shape and device, both of which the job fixes).
        "backend": encoder.config.backend,
        "device": encoder.device.type,
    }
    # The prompt put before every text (a named one resolved to its text, the model's default
    # included) makes other vectors: a run resumed with another is refused, not mixed. Kept
    # out of the job when there is none, so that the chunks of earlier runs keep their job.
    prompt = computed_prompt(encoder, encode_options)  # a prompt_name it lacks: before any work
    if prompt is not None:
        job["prompt"] = prompt
    out.mkdir(parents=True, exist_ok=True)
    done = _complete_manifest(out, job, fmt)
    chunks = rank_chunks(len(texts), chunk_rows, rank, world)
    first, stop = chunks.start * chunk_rows, min(chunks.stop * chunk_rows, len(texts))
    if done:
        log.info("%s already holds this job's shards (%s)", out, MANIFEST)
        # A run killed between its manifest and the clean-up left its chunks (a second copy
        # of every embedding) and perhaps temporary files: once the manifest is written no
        # rank of any run reads them, so they go now.
        cleaned = remove_leftovers(out, read_object(out / MANIFEST, "manifest"))
        return ShardResult(rank, world, None, (first, stop), 0, 0, False, cleaned=cleaned)
    name = shard_name(rank, world, fmt)
    if _recorded(out, rank, world, job, fmt):
        log.info("rank %d/%d: %s was written by an earlier run: kept", rank, world, name)
        cleaned = _finish(out, job, fmt, world, identity, source)
        return ShardResult(
            rank,
            world,
            name,
            (first, stop),
            0,
            len(chunks),
            cleaned is not None,
            tuple(chunks),
            kept=True,
            cleaned=cleaned or [],
        )
    store = ChunkStore(out / CHUNKS, job)
    started = time.perf_counter()
    progress = encode_options.pop("progress", None)
    reorder_as_one_call(encoder, texts, precision)
    reused_chunks: list[int] = []

    def chunk_done(index: int, reused: bool) -> None:
        if reused:
            reused_chunks.append(index)
            if callable(progress):  # else a resumed run's progress stops short of its end
                progress(min((index + 1) * chunk_rows, len(texts)), len(texts))
        if on_chunk is not None:
            on_chunk(index, reused)

    encoded, reused = embed_chunks(
        lambda chunk, start: encoder.encode(
            chunk,
            normalize=normalize,
            precision=precision,
            progress=chunk_progress(progress, start, len(texts)),
            **encode_options,
        ),
        texts,
        store,
        chunk_rows,
        chunks=chunks,
        on_chunk=chunk_done,
        consequence="that chunk was not committed and no shard was written",
    )
    log.info(
        "rank %d/%d: rows %d-%d, %d chunks encoded, %d reused, in %.1fs",
        rank,
        world,
        first,
        stop,
        encoded,
        reused,
        time.perf_counter() - started,
    )
    parts = [store.read(i) for i in chunks]
    dimensions = parts[0].shape[1] if parts else encoder.dim
    vectors = np.concatenate(parts) if parts else np.empty((0, dimensions), np.float32)
    if fmt == "npy":
        with atomic_write(out / name, "wb") as handle:
            np.save(handle, vectors)
    else:
        _write_parquet(out / name, range(first, stop), texts[first:stop], vectors)
    record = {
        "job": job,
        "format": fmt,
        "rank": rank,
        "world": world,
        "file": name,
        "rows": [first, stop],
        "count": stop - first,
        "dimensions": int(dimensions),
        "bytes": (out / name).stat().st_size,
        "sha256": file_sha256(out / name),
    }
    write_json(record_path(out, rank, world), record)
    cleaned = _finish(out, job, fmt, world, identity, source)
    return ShardResult(
        rank,
        world,
        name,
        (first, stop),
        encoded,
        reused,
        cleaned is not None,
        tuple(reused_chunks),
        cleaned=cleaned or [],
    )


def read_manifest(out: str | os.PathLike) -> dict[str, Any]:
    path = Path(out) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{out} holds no {MANIFEST}: the run has not finished")
    return read_object(path, "manifest")


def read_shards(out: str | os.PathLike, verify: bool = True) -> np.ndarray:
    """Every shard's embeddings in row order, (rows, D) float32; with ``verify``, each
    shard's size and SHA-256, and its row count, are checked against the manifest first."""
    out = Path(out)
    manifest = read_manifest(out)
    parts = []
    for shard in manifest["shards"]:
        path = out / shard["file"]
        problem = _shard_problem(path, shard) if verify else None
        if problem is not None:
            raise ValueError(f"{path} {problem} ({out / MANIFEST})")
        if manifest["format"] == "npy":
            part = np.load(path)
        else:
            table = _pyarrow().parquet.read_table(path, columns=["embedding"])
            column = table.column("embedding").combine_chunks()
            # The manifest's width, not -1: a shard of no rows (more ranks than chunks) has
            # no width of its own to infer.
            values = column.values.to_numpy()
            part = values.reshape(len(table), manifest["dimensions"]).astype(np.float32)
        if len(part) != shard["count"]:
            raise ValueError(f"{path} holds {len(part)} rows, its manifest says {shard['count']}")
        parts.append(part)
    return np.concatenate(parts)


def _complete_manifest(out: Path, job: dict, fmt: str) -> bool:
    """Whether ``out`` holds this job's manifest, every shard it lists there and whole;
    ValueError for another job's, or for a shard missing or damaged."""
    path = out / MANIFEST
    if not path.is_file():
        return False
    manifest = read_object(path, "manifest")
    if manifest.get("job") != job or manifest.get("format") != fmt:
        raise ValueError(
            f"{out} already holds the shards of another run (its {MANIFEST} differs in input, "
            "model, options or format); use another --output directory or remove that one"
        )
    shards = manifest.get("shards")
    listed = isinstance(shards, list) and all(
        isinstance(s, dict) and isinstance(s.get("file"), str) for s in shards
    )
    if not listed or not isinstance(manifest.get("world"), int):
        raise ValueError(f"{path} is damaged (no list of shards): remove {out} and run again")
    for shard in shards:
        problem = _shard_problem(out / shard["file"], shard)
        if problem is not None:
            # The chunks went when the manifest was written: nothing is left to rebuild it from.
            raise ValueError(
                f"{out / shard['file']} {problem} (listed in {path}); the chunks it was made "
                f"from are gone: remove {out} and run again to encode the corpus anew"
            )
    return True


def _shard_problem(path: Path, entry: dict[str, Any]) -> str | None:
    """What is wrong with the shard file ``path`` against its record or manifest entry
    (its size first, which costs no read, then its SHA-256); None if nothing."""
    if not path.is_file():
        return "is missing"
    size, recorded = path.stat().st_size, entry.get("bytes")
    if recorded is not None and size != recorded:
        return f"holds {size} bytes, where {recorded} were written"
    if file_sha256(path) != entry.get("sha256"):
        return "does not match its recorded SHA-256"
    return None


def _recorded(out: Path, rank: int, world: int, job: dict, fmt: str) -> bool:
    """Whether rank ``rank``'s shard of this job is written and recorded (by a run killed
    after it), its file whole: its size and checksum are the record's."""
    path = record_path(out, rank, world)
    if not path.is_file():
        return False
    record = read_object(path, "shard record")
    return (
        record.get("job") == job
        and record.get("format") == fmt
        and isinstance(record.get("file"), str)
        and _shard_problem(out / record["file"], record) is None
    )


def _finish(out: Path, job: dict, fmt: str, world: int, identity, source) -> list[str] | None:
    """Write the manifest if every shard of this run is recorded (any rank may find that;
    two ranks that both do write the same bytes), and remove the leftovers: what was removed,
    or None where the manifest is not written yet.

    A record may be a killed run's: its rank, run again, keeps that shard and reads no chunk
    (:func:`_recorded`), so once every rank is recorded none reads a chunk any more and the
    chunks can go."""
    records = []
    for rank in range(world):
        path = record_path(out, rank, world)
        if not path.is_file():
            return None
        record = read_object(path, "shard record")
        if record.get("job") != job or record.get("format") != fmt:
            return None  # left by an earlier run; this run's rank has not written it yet
        records.append(record)
    manifest = {
        "job": job,
        "format": fmt,
        "rows": job["rows"],
        "dimensions": records[0]["dimensions"],
        "model": identity.to_dict(),
        "input": source or {},
        "world": world,
        "shards": [
            {k: r[k] for k in SHARD_ENTRY if k in r}  # "bytes" is missing from older records
            for r in records
        ],
    }
    _write_manifest(out, manifest)
    removed = remove_leftovers(out, manifest)
    log.info("wrote %s: %d rows in %d shards", out / MANIFEST, job["rows"], world)
    return removed


def _write_manifest(out: Path, manifest: dict[str, Any]) -> None:
    try:
        write_json(out / MANIFEST, manifest)
    except FileNotFoundError:
        # Its temporary file removed under it: another rank found every shard recorded at the
        # same moment, published the same manifest first and removed the manifest's
        # temporary files as a killed write's (remove_leftovers). Its manifest is this one.
        path = out / MANIFEST
        if not path.is_file():
            raise
        found = read_object(path, "manifest")
        if (found.get("job"), found.get("shards")) != (manifest["job"], manifest["shards"]):
            raise


def _write_parquet(path: Path, rows: range, texts: Sequence[str], vectors: np.ndarray) -> None:
    pa = _pyarrow()
    dimensions = vectors.shape[1]
    embedding = pa.FixedSizeListArray.from_arrays(
        pa.array(vectors.reshape(-1), type=pa.float32()), dimensions
    )
    table = pa.table(
        {
            "row": pa.array(np.arange(rows.start, rows.stop, dtype=np.int64)),
            "text": pa.array(list(texts), type=pa.string()),
            "embedding": embedding,
        }
    )
    with atomic_write(path, "wb") as handle:
        pa.parquet.write_table(table, handle)


def _pyarrow():
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401 -- pyarrow.parquet is used through the package
    except ImportError:
        raise ImportError(
            "Parquet shards need pyarrow: pip install 'clearformer[index]' (or pip install "
            "pyarrow), or write .npy shards"
        ) from None
    return pyarrow


def corpus_sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
