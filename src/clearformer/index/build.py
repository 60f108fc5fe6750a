"""Writing an index: ``build_index`` and ``add_to_index`` (one writer at a time, under the
directory's lock).

1. embed the texts in chunks, each committed once (:mod:`.chunks`; a killed run resumes);
2. truncate to ``dimensions`` and renormalise, quantize to the storage, and write a new
   immutable segment: float32 vectors, stored vectors, texts and ids (:mod:`.texts`);
3. write a new generation: the list of segments and, for a graph, the HNSW file (the previous
   graph loaded and extended, so an add costs the new vectors, not the whole index);
4. replace ``CURRENT`` (the commit), then remove what no kept generation uses (:mod:`.layout`).

:func:`stage_add` stops before step 4 and leaves the commit to its caller: a folder of kinds
commits its dense add together with its other kinds (:mod:`.kinds_add`). Reading is
:mod:`.vector_index`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import engine, integrity, layout
from .chunks import ChunkStore, chunk_count, chunk_progress, embed_chunks, texts_sha256
from .identity import ModelIdentity
from .inputs import check_ids, check_texts
from .kinds import identity_of, model_kind_of
from .options import IndexOptions, resolve_ann
from .quantize import int8_ranges, quantize, stored_bytes, truncate
from .recipe import (
    check_adds_alike,
    computed_precision,
    computed_prompt,
    index_precision,
    index_prompt,
)
from .texts import write_texts
from .vector_index import FORMAT, VectorIndex, stored_vectors

log = logging.getLogger(__name__)

ChunkCallback = Callable[[int, bool], None]
ProgressFn = Callable[[int, int], None]  # (done, total)


def build_index(
    path: str | os.PathLike,
    texts: Sequence[str],
    encoder,
    *,
    ids: Sequence[str] | None = None,
    options: IndexOptions | None = None,
    source: dict[str, Any] | None = None,
    on_chunk: ChunkCallback | None = None,
    graph_progress: ProgressFn | None = None,
    **encode_options: Any,
) -> VectorIndex:
    """Build (or rebuild) the index at ``path`` from ``texts`` with ``encoder``.

    Args:
        texts: the texts; ``ids``: one string id each (default: their row numbers).
        options: storage, dimensions, graph settings (:class:`~.options.IndexOptions`).
        source: where the texts came from (recorded in the segment, e.g. a file and its hash).
        on_chunk: called with (chunk index, reused) after each chunk of embeddings.
        graph_progress: called with (vectors inserted, vectors to insert) while the HNSW
            graph is built (from the graph library's threads).
        encode_options: passed to ``encoder.encode`` (``batch_size``, ``max_tokens``,
            ``workers``, ``progress``); they change speed, never the vectors.

    A build killed at any point leaves the previous index (if any) current and whole; the
    same call again reuses every chunk of embeddings it committed. A build of the same texts
    with the same options as the current generation commits nothing, unless a file of that
    generation is damaged (:class:`~.layout.IndexDamagedError`): then the damaged files are
    written again, so running the same build again is how a damaged index is repaired.
    """
    options = IndexOptions() if options is None else options
    if not isinstance(options, IndexOptions):
        raise TypeError(f"options must be an IndexOptions, got {type(options).__name__}")
    hooks = _Hooks(on_chunk, graph_progress)
    return _write(Path(path), texts, encoder, ids, options, None, source, hooks, encode_options)


def add_to_index(
    path: str | os.PathLike,
    texts: Sequence[str],
    encoder,
    *,
    ids: Sequence[str] | None = None,
    source: dict[str, Any] | None = None,
    on_chunk: ChunkCallback | None = None,
    graph_progress: ProgressFn | None = None,
    **encode_options: Any,
) -> VectorIndex:
    """Add ``texts`` to the committed index at ``path`` with its own storage and dimensions.

    Exactly once per add: texts (with their ids) that the build or an earlier add committed
    as one write are not added again (the same call run again, after a kill or a commit, adds
    nothing); a killed add resumes from its committed chunks. A call whose texts differ in any
    way is another add, all of whose texts are added. ``on_chunk``,
    ``graph_progress`` and ``encode_options`` as :func:`build_index`.
    """
    root = Path(path)
    base = VectorIndex.open(root)
    hooks = _Hooks(on_chunk, graph_progress)
    return _write(root, texts, encoder, ids, base.options, base, source, hooks, encode_options)


@dataclass(frozen=True)
class _Hooks:
    """What a caller is told while a write runs (besides ``encode``'s own ``progress``)."""

    on_chunk: ChunkCallback | None = None
    graph_progress: ProgressFn | None = None


def stage_add(
    path: str | os.PathLike,
    texts: Sequence[str],
    encoder,
    *,
    ids: Sequence[str],
    source: dict[str, Any] | None = None,
    on_chunk: ChunkCallback | None = None,
    graph_progress: ProgressFn | None = None,
    **encode_options: Any,
) -> StagedWrite | None:
    """An add to the dense index at ``path`` (as :func:`add_to_index`) written up to its
    commit: its generation is whole but not current until :meth:`StagedWrite.commit`. None
    when the index already holds these texts. The caller holds ``path``'s writer lock: an
    add that commits with other indexes (a folder of kinds, :mod:`.kinds_add`) decides when."""
    root = Path(path)
    base = VectorIndex.open(root)
    hooks = _Hooks(on_chunk, graph_progress)
    plan = _plan(root, texts, encoder, ids, base.options, base, encode_options)
    staged = _stage(root, plan, encoder, base.options, base, source, hooks, encode_options)
    return None if isinstance(staged, VectorIndex) else staged


@dataclass(frozen=True)
class StagedWrite:
    """A build or add written into a generation that is not current yet."""

    root: Path
    generation: str
    job_key: str  # its chunks, in staging/, removed once it is committed

    def commit(self) -> None:
        """Replace ``CURRENT`` (the commit), then remove what no kept generation uses and
        every staged job: this one's chunks, and those a stopped write of other texts left
        (the writer lock is held, so no other write is staging; rerunning that write embeds
        its texts again rather than keep a copy of its embeddings on disk indefinitely)."""
        layout.commit(self.root, self.generation)
        log.info("committed %s of %s", self.generation, self.root)
        layout.remove_stale(self.root)
        layout.clear_staging(self.root, self.job_key)


@dataclass(frozen=True)
class _Plan:
    """A write, checked: its texts and ids, what it holds, the model and the chunks' job."""

    texts: list[str]
    ids: list[str]
    content: str
    identity: ModelIdentity
    dimensions: int
    job: dict[str, Any]
    job_key: str
    default_ids: bool = False  # ids are row numbers (none were given)


def _write(
    root: Path,
    texts: Sequence[str],
    encoder,
    ids: Sequence[str] | None,
    options: IndexOptions,
    base: VectorIndex | None,
    source: dict[str, Any] | None,
    hooks: _Hooks,
    encode_options: dict[str, Any],
) -> VectorIndex:
    plan = _plan(root, texts, encoder, ids, options, base, encode_options)
    with layout.writer_lock(root):
        staged = _stage(root, plan, encoder, options, base, source, hooks, encode_options)
        if isinstance(staged, VectorIndex):
            return staged  # already held: nothing written
        staged.commit()
    return VectorIndex.open(root, encoder)


def _plan(
    root: Path,
    texts: Sequence[str],
    encoder,
    ids: Sequence[str] | None,
    options: IndexOptions,
    base: VectorIndex | None,
    encode_options: dict[str, Any],
) -> _Plan:
    """Every check before any work: nothing is embedded for a write that would be refused."""
    texts = check_texts(texts)
    given = None if ids is None else check_ids(ids, texts)
    # What a write holds, for exactly-once adds: the texts, and the ids when the caller named
    # them (default ids are row numbers, which differ from one add to the next).
    named = None if given is None else texts_sha256(given)
    content = _sha256_json({"texts": texts_sha256(texts), "ids": named})
    first = 0 if base is None else base.rows
    ids = [str(first + i) for i in range(len(texts))] if given is None else given
    # Another kind's model has no dense encode(): refused here, before any work.
    if model_kind_of(encoder) != "dense":
        raise ValueError(
            f"encoder: a dense index needs a dense model, got a {model_kind_of(encoder)} model"
            + (" (its dense view: encoder.as_dense())" if hasattr(encoder, "as_dense") else "")
        )
    identity = identity_of(encoder)  # a TextEncoder's, or a dense view's (bge-m3's)
    precision = computed_precision(encoder, encode_options.get("precision"))
    prompt = computed_prompt(encoder, encode_options)
    if base is not None:
        check_adds_alike(root, base, identity, precision, prompt)
    dimensions = options.dimensions or identity.width
    if dimensions > identity.width:
        raise ValueError(
            f"dimensions must be at most the model's width {identity.width}, got {dimensions}"
        )
    if options.storage == "int8" and base is None and len(texts) < 2:
        raise ValueError("int8 storage calibrates on the build's texts: give at least 2")
    engine.usearch_index_module()  # a missing engine fails now, not after the embedding
    job = {
        "texts": texts_sha256(texts),
        "rows": len(texts),
        "model": identity.revision,
        "pooling": identity.pooling,
        "max_length": identity.max_length,
        "normalize": True,
        # What the chunks are computed in (an encoder loaded in bf16 or int8 runs that by
        # default): chunks of one precision are never resumed into a write of another.
        "precision": precision,
        "chunk_rows": options.chunk_rows,
        # The text put before each one changes every vector (recorded only where there is
        # one, so that the chunks of a build without a prompt keep their key).
        **({} if prompt is None else {"prompt": prompt}),
    }
    key = _sha256_json(job)[:16]
    return _Plan(texts, ids, content, identity, dimensions, job, key, default_ids=named is None)


def _stage(
    root: Path,
    plan: _Plan,
    encoder,
    options: IndexOptions,
    base: VectorIndex | None,
    source: dict[str, Any] | None,
    hooks: _Hooks,
    encode_options: dict[str, Any],
) -> StagedWrite | VectorIndex:
    """Embed, write the segment and the generation (not current yet); with ``root``'s writer
    lock held. The committed index instead when it already holds these texts."""
    texts, ids, dimensions = plan.texts, plan.ids, plan.dimensions
    current, committed = _committed(root, building=base is None)
    if base is not None and committed is not None and committed["generation"] != base.generation:
        base = VectorIndex.open(root)  # another write committed since we looked: add to it
        committed = base.meta
        # The checks before the lock saw the index as it was: a rebuild since may hold another
        # model, precision or storage, which this add's vectors must not join.
        check_adds_alike(root, base, plan.identity, plan.job["precision"], plan.job.get("prompt"))
        if base.options != options:
            raise ValueError(
                f"index {root} was built again with other options while this add waited for "
                f"it ({base.options.to_dict()}, not {options.to_dict()}): run the add again"
            )
        if plan.default_ids:  # row numbers, which that add moved on
            ids = [str(base.rows + i) for i in range(len(texts))]
    if committed is not None and _already_holds(
        committed, plan.content, options, plan.identity, base, plan.job
    ):
        held = _whole(root)
        if held is not None:
            log.info("%s already holds these texts (%s): nothing to do", root, current)
            layout.remove_stale(root)
            shutil.rmtree(root / "staging" / plan.job_key, ignore_errors=True)
            return held
    started = time.perf_counter()
    store = ChunkStore(root / "staging" / plan.job_key, plan.job)
    progress = encode_options.pop("progress", None)
    chunks = chunk_count(len(texts), options.chunk_rows)
    log.info(
        "embedding %s texts in %d chunk(s) of up to %s",
        f"{len(texts):,}",
        chunks,
        f"{options.chunk_rows:,}",
    )

    encoded, reused = embed_chunks(
        lambda chunk, start: encoder.encode(
            chunk,
            normalize=True,
            progress=chunk_progress(progress, start, len(texts)),
            **encode_options,
        ),
        texts,
        store,
        options.chunk_rows,
        on_chunk=hooks.on_chunk,
    )
    log.info(
        "embedded %s texts (%d chunk(s) encoded, %d reused) in %.1fs",
        f"{len(texts):,}",
        encoded,
        reused,
        time.perf_counter() - started,
    )
    # (n, d) unit rows, a chunk at a time: the full-width vectors are never all in memory
    vectors = np.concatenate(
        [truncate(store.read(i, mmap=True), dimensions) for i in range(encoded + reused)]
    )
    ranges = None if base is None else base.ranges
    if options.storage == "int8" and ranges is None:
        ranges = int8_ranges(vectors)
    segment = _write_segment(root, vectors, texts, ids, options, ranges, plan, source)
    generation = _write_generation(
        root, base, plan.identity, options, dimensions, ranges, segment, current, hooks
    )
    return StagedWrite(root, generation, plan.job_key)


def _committed(root: Path, building: bool) -> tuple[str | None, dict | None]:
    """The current generation's name and ``meta.json``. A build replaces the index whatever
    it holds, so for a build a damaged ``CURRENT`` or ``meta.json`` counts as no index (the
    damaged generation is not kept as the previous one); an add needs both whole."""
    try:
        current = layout.current_generation(root)
        if current is None:
            return None, None
        meta_path = layout.generation_dir(root, current) / layout.META
        return current, integrity.read_meta(meta_path, current, FORMAT)
    except layout.IndexDamagedError as exc:
        if not building:
            raise
        log.warning("%s; the build writes the index anew", exc)
        return None, None


def _whole(root: Path) -> VectorIndex | None:
    """The committed index, or None when one of its files is damaged (then written again)."""
    try:
        return VectorIndex.open(root)
    except layout.IndexDamagedError as exc:
        log.warning("%s; writing the index's files again", exc)
        return None


def _already_holds(
    meta: dict, content: str, options: IndexOptions, identity, base, job: dict[str, Any]
) -> bool:
    if base is None:  # a build: the current generation is exactly this build
        same = IndexOptions.from_dict(meta["options"]) == options
        same = same and meta["model"]["revision"] == identity.revision
        same = same and index_precision(meta) == job["precision"]
        same = same and index_prompt(meta) == job.get("prompt")
        return same and [s["content"] for s in meta["segments"]] == [content]
    return any(s["content"] == content for s in meta["segments"])


def _write_segment(root, vectors, texts, ids, options, ranges, plan: _Plan, source):
    content, precision = plan.content, plan.job["precision"]
    other = {} if precision == "float32" else {"precision": precision}
    if "prompt" in plan.job:
        other["prompt"] = plan.job["prompt"]
    # The name is the hash of everything the segment's files hold, so that a folder of that
    # name left by an earlier write is this write's: the model (``job_key``: its revision,
    # pooling, length and precision), and the ids as written (default ids are row numbers,
    # which move with the rows before them).
    stored_key = _sha256_json(
        {
            "content": content,
            "storage": options.storage,
            "dimensions": vectors.shape[1],
            "ranges": None if ranges is None else ranges.tolist(),
            "job": plan.job_key,
            "ids": texts_sha256(list(ids)),
            **other,
        }
    )
    name = f"seg-{stored_key[:16]}"
    target = layout.segment_dir(root, name)
    record = {
        "name": name,
        "rows": len(texts),
        "content": content,
        "source": source or {},
        **other,
    }
    # An earlier run of this write may have made it already; a damaged one is made again.
    if target.is_dir() and not _segment_is_whole(target, record, vectors.shape[1], options):
        shutil.rmtree(target)
    if not target.is_dir():
        with layout.new_directory(target) as folder:
            np.save(folder / layout.VECTORS, vectors)
            if options.storage != "float32":
                np.save(folder / layout.STORED, quantize(vectors, options.storage, ranges))
            write_texts(folder / layout.TEXTS, ids, texts)
            layout.write_json(folder / layout.SEGMENT_RECORD, record)
    return record


def _segment_is_whole(folder: Path, record: dict, dimensions: int, options: IndexOptions) -> bool:
    """Whether an existing segment directory passes the checks a reader makes (its name is
    its content's hash, so a whole one holds exactly what this write would put there)."""
    rows, storage = record["rows"], options.storage
    about = folder / layout.SEGMENT_RECORD
    try:
        integrity.check_array(folder / layout.VECTORS, rows, dimensions, "float32", about)
        if storage != "float32":
            dtype = "int8" if storage == "int8" else "uint8"
            width = stored_bytes(storage, dimensions)
            integrity.check_array(folder / layout.STORED, rows, width, dtype, about)
        integrity.check_texts(folder / layout.TEXTS, rows, about)
        integrity.check_segment_record(folder / layout.SEGMENT_RECORD, record, about)
    except layout.IndexDamagedError as exc:
        log.warning("%s; writing the segment again", exc)
        return False
    return True


def _write_generation(
    root, base, identity, options, dimensions, ranges, segment, current, hooks: _Hooks
) -> str:
    previous = [] if base is None else base.meta["segments"]
    offset = sum(s["rows"] for s in previous)
    segments = [*previous, {**segment, "offset": offset}]
    rows = offset + segment["rows"]
    ann = resolve_ann(options.ann, rows)
    name = layout.next_generation_name(root)
    meta = {
        "format": FORMAT,
        "generation": name,
        "previous": current,  # the committed generation this one replaces: kept for readers
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "model": identity.to_dict() if base is None else base.meta["model"],
        "options": options.to_dict(),
        "dimensions": dimensions,
        "ann": ann,
        "rows": rows,
        "int8_ranges": None if ranges is None else ranges.tolist(),
        "segments": segments,
    }
    with layout.new_directory(layout.generation_dir(root, name)) as folder:
        if ann == "hnsw":
            started = time.perf_counter()
            if base is not None and base.ann == "hnsw":
                graph = engine.open_graph(
                    layout.generation_dir(root, base.generation) / layout.GRAPH, view=False
                )
                todo = [segments[-1]]
            else:
                graph = engine.new_graph(options.storage, dimensions, options)
                todo = segments
            adding = sum(entry["rows"] for entry in todo)
            log.info(
                "building the graph: inserting %s of its %s vectors", f"{adding:,}", f"{rows:,}"
            )
            inserted = 0
            for entry in todo:
                engine.add_to_graph(
                    graph,
                    entry["offset"],
                    stored_vectors(root, entry, options.storage),
                    progress=_graph_progress(hooks.graph_progress, inserted, adding),
                )
                inserted += entry["rows"]
            engine.save_graph(graph, folder / layout.GRAPH)
            log.info(
                "graph of %s vectors saved in %.1fs", f"{rows:,}", time.perf_counter() - started
            )
        layout.write_json(folder / layout.META, meta)
    return name


def _graph_progress(progress: ProgressFn | None, before: int, total: int) -> ProgressFn | None:
    """One segment's insertions, (done, its rows), as the graph build's (done, total)."""
    if progress is None:
        return None
    return lambda done, _: progress(before + done, total)


def _sha256_json(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode("utf-8")).hexdigest()
