"""Writing an index: ``build_index`` and ``add_to_index`` (one writer at a time, under the
directory's lock).

1. embed the texts in chunks, each committed once (:mod:`.chunks`; a killed run resumes);
2. truncate to ``dimensions`` and renormalise, quantize to the storage, and write a new
   immutable segment: float32 vectors, stored vectors, texts and ids (:mod:`.texts`);
3. write a new generation: the list of segments and, for a graph, the HNSW file (the previous
   graph loaded and extended, so an add costs the new vectors, not the whole index);
4. replace ``CURRENT`` (the commit), then remove what no kept generation uses (:mod:`.layout`).

Reading is :mod:`.vector_index`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import engine, layout
from .chunks import ChunkStore, chunk_progress, embed_chunks, texts_sha256
from .identity import ModelIdentity
from .options import EXACT_MAX_ROWS, IndexOptions
from .quantize import int8_ranges, quantize, truncate
from .texts import write_texts
from .vector_index import FORMAT, VectorIndex, stored_vectors

log = logging.getLogger(__name__)

ChunkCallback = Callable[[int, bool], None]


def build_index(
    path: str | os.PathLike,
    texts: Sequence[str],
    encoder,
    *,
    ids: Sequence[str] | None = None,
    options: IndexOptions | None = None,
    source: dict[str, Any] | None = None,
    on_chunk: ChunkCallback | None = None,
    **encode_options: Any,
) -> VectorIndex:
    """Build (or rebuild) the index at ``path`` from ``texts`` with ``encoder``.

    Args:
        texts: the texts; ``ids``: one string id each (default: their row numbers).
        options: storage, dimensions, graph settings (:class:`~.options.IndexOptions`).
        source: where the texts came from (recorded in the segment, e.g. a file and its hash).
        on_chunk: called with (chunk index, reused) after each chunk of embeddings.
        encode_options: passed to ``encoder.encode`` (``batch_size``, ``max_tokens``,
            ``workers``, ``progress``); they change speed, never the vectors.

    A build killed at any point leaves the previous index (if any) current and whole; the
    same call again reuses every chunk of embeddings it committed. A build of the same texts
    with the same options as the current generation commits nothing.
    """
    options = IndexOptions() if options is None else options
    if not isinstance(options, IndexOptions):
        raise TypeError(f"options must be an IndexOptions, got {type(options).__name__}")
    return _write(Path(path), texts, encoder, ids, options, None, source, on_chunk, encode_options)


def add_to_index(
    path: str | os.PathLike,
    texts: Sequence[str],
    encoder,
    *,
    ids: Sequence[str] | None = None,
    source: dict[str, Any] | None = None,
    on_chunk: ChunkCallback | None = None,
    **encode_options: Any,
) -> VectorIndex:
    """Add ``texts`` to the committed index at ``path`` with its own storage and dimensions.

    Exactly once: texts (with their ids) that an earlier add or the build already committed
    are not added again; a killed add resumes from its committed chunks.
    """
    root = Path(path)
    base = VectorIndex.open(root)
    return _write(root, texts, encoder, ids, base.options, base, source, on_chunk, encode_options)


def _write(
    root: Path,
    texts: Sequence[str],
    encoder,
    ids: Sequence[str] | None,
    options: IndexOptions,
    base: VectorIndex | None,
    source: dict[str, Any] | None,
    on_chunk: ChunkCallback | None,
    encode_options: dict[str, Any],
) -> VectorIndex:
    # Every check before any work: nothing is embedded for a write that would be refused.
    texts = _check_texts(texts)
    # What a write holds, for exactly-once adds: the texts, and the ids when the caller named
    # them (default ids are row numbers, which differ from one add to the next).
    named = None if ids is None else texts_sha256(_check_ids(ids, texts))
    content = _sha256_json({"texts": texts_sha256(texts), "ids": named})
    first = 0 if base is None else base.rows
    ids = [str(first + i) for i in range(len(texts))] if ids is None else _check_ids(ids, texts)
    identity = ModelIdentity.of(encoder)
    if base is not None:
        base.identity.check_same(identity, f"index {root}")
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
        "precision": "float32",
        "chunk_rows": options.chunk_rows,
    }
    job_key = _sha256_json(job)[:16]

    with layout.writer_lock(root):
        current = layout.current_generation(root)
        committed = None
        if current is not None:
            committed = layout.read_json(layout.generation_dir(root, current) / "meta.json")
        if (
            base is not None
            and committed is not None
            and committed["generation"] != base.generation
        ):
            base = VectorIndex.open(root)  # another add committed since we looked: add to it
            committed = base.meta
        if committed is not None and _already_holds(committed, content, options, identity, base):
            log.info("%s already holds these texts (%s): nothing to do", root, current)
            layout.remove_stale(root)
            shutil.rmtree(root / "staging" / job_key, ignore_errors=True)
            return VectorIndex.open(root)
        started = time.perf_counter()
        store = ChunkStore(root / "staging" / job_key, job)
        progress = encode_options.pop("progress", None)
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
            on_chunk=on_chunk,
        )
        log.info(
            "embedded %d texts (%d chunks encoded, %d reused) in %.1fs",
            len(texts),
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
        segment = _write_segment(root, vectors, texts, ids, options, ranges, content, source)
        generation = _write_generation(
            root, base, identity, options, dimensions, ranges, segment, current
        )
        layout.commit(root, generation)
        log.info("committed %s of %s", generation, root)
        layout.remove_stale(root)
        shutil.rmtree(root / "staging" / job_key, ignore_errors=True)
    return VectorIndex.open(root, encoder)


def _already_holds(meta: dict, content: str, options: IndexOptions, identity, base) -> bool:
    if base is None:  # a build: the current generation is exactly this build
        same = IndexOptions.from_dict(meta["options"]) == options
        same = same and meta["model"]["revision"] == identity.revision
        return same and [s["content"] for s in meta["segments"]] == [content]
    return any(s["content"] == content for s in meta["segments"])


def _write_segment(root, vectors, texts, ids, options, ranges, content, source) -> dict:
    stored_key = _sha256_json(
        {
            "content": content,
            "storage": options.storage,
            "dimensions": vectors.shape[1],
            "ranges": None if ranges is None else ranges.tolist(),
        }
    )
    name = f"seg-{stored_key[:16]}"
    target = layout.segment_dir(root, name)
    record = {
        "name": name,
        "rows": len(texts),
        "content": content,
        "source": source or {},
    }
    if not target.is_dir():  # an earlier run of this write may have made it already
        with layout.new_directory(target) as folder:
            np.save(folder / "vectors.npy", vectors)
            if options.storage != "float32":
                np.save(folder / "stored.npy", quantize(vectors, options.storage, ranges))
            write_texts(folder / "texts.sqlite", ids, texts)
            layout.write_json(folder / "segment.json", record)
    return record


def _write_generation(root, base, identity, options, dimensions, ranges, segment, current) -> str:
    previous = [] if base is None else base.meta["segments"]
    offset = sum(s["rows"] for s in previous)
    segments = [*previous, {**segment, "offset": offset}]
    rows = offset + segment["rows"]
    ann = options.ann if options.ann != "auto" else ("exact" if rows <= EXACT_MAX_ROWS else "hnsw")
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
                    layout.generation_dir(root, base.generation) / "hnsw.usearch", view=False
                )
                todo = [segments[-1]]
            else:
                graph = engine.new_graph(options.storage, dimensions, options)
                todo = segments
            for entry in todo:
                engine.add_to_graph(
                    graph, entry["offset"], stored_vectors(root, entry, options.storage)
                )
            engine.save_graph(graph, folder / "hnsw.usearch")
            log.info("graph of %d vectors saved in %.1fs", rows, time.perf_counter() - started)
        layout.write_json(folder / "meta.json", meta)
    return name


def _check_texts(texts: Sequence[str]) -> list[str]:
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise TypeError(f"texts must be a list of str, got {type(texts).__name__}")
    texts = list(texts)
    if not texts:
        raise ValueError("texts is empty: an index needs at least one text")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"texts[{i}] must be a str, got {type(text).__name__}")
    return texts


def _check_ids(ids: Sequence[str], texts: list[str]) -> list[str]:
    ids = [str(i) for i in ids]
    if len(ids) != len(texts):
        raise ValueError(f"ids must be one per text: got {len(ids)} ids for {len(texts)} texts")
    return ids


def _sha256_json(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode("utf-8")).hexdigest()
