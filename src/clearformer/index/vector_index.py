"""``VectorIndex``: a persistent, searchable index of text embeddings.

Build and add (writers, one at a time, under the directory's lock):

1. embed the texts in chunks, each committed once (:mod:`.chunks`; a killed run resumes);
2. truncate to ``dimensions`` and renormalise, quantize to the storage, and write a new
   immutable segment: float32 vectors, stored vectors, texts and ids (:mod:`.texts`);
3. write a new generation: the list of segments and, for a graph, the HNSW file (the previous
   graph loaded and extended, so an add costs the new vectors, not the whole index);
4. replace ``CURRENT`` (the commit), then remove what no kept generation uses (:mod:`.layout`).

Search (readers, any number, no lock): read ``CURRENT`` once, memory-map that generation's
graph and the segments' float32 vectors, find ``k * rescore`` candidates in the stored
vectors (graph or exact scan), rescore them with the float32 vectors, return the best ``k``
with their ids and texts. A score is always the float32 cosine of the query and the text.
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

from . import engine, layout
from .chunks import ChunkStore, chunk_progress, embed_chunks, texts_sha256
from .identity import ModelIdentity
from .options import EXACT_MAX_ROWS, IndexOptions
from .quantize import int8_ranges, quantize, stored_bytes, truncate
from .texts import TextStore, write_texts

log = logging.getLogger(__name__)

FORMAT = 1  # meta.json's format version
_OPEN_TRIES = 5  # a reader that loses a race with two commits in a row reads CURRENT again


class IndexNotFoundError(FileNotFoundError):
    """No committed index at the path."""


@dataclass(frozen=True)
class Hit:
    """One search result: the float32 cosine, the text's id and text, its row in the index."""

    score: float
    id: str
    text: str
    row: int


@dataclass(frozen=True)
class IndexStats:
    """Size of an index. Memory is what a search keeps resident (the graph, or the stored
    vectors an exact scan reads); the float32 vectors for rescoring and the texts stay on disk,
    read a few rows per query."""

    rows: int
    dimensions: int
    storage: str
    ann: str
    stored_bytes_per_vector: int
    memory_bytes: int
    disk_bytes: int

    @property
    def memory_per_vector(self) -> float:
        return self.memory_bytes / max(self.rows, 1)

    @property
    def disk_per_vector(self) -> float:
        return self.disk_bytes / max(self.rows, 1)


@dataclass
class _Segment:
    name: str
    offset: int
    rows: int
    vectors: np.ndarray  # (rows, d) float32, memory-mapped
    texts: TextStore


class VectorIndex:
    """A committed generation of an index directory, opened for search.

    Open with :meth:`open` (or ``TextEncoder.open_index``); make one with :func:`build_index`.
    The object keeps reading the generation it opened, whatever writers commit later.
    """

    def __init__(self, root: Path, generation: str, meta: dict[str, Any], encoder=None) -> None:
        self.root = root
        self.generation = generation
        self.meta = meta
        self.encoder = encoder
        self.identity = ModelIdentity.from_dict(meta["model"])
        self.options = IndexOptions.from_dict(meta["options"])
        self.dimensions: int = meta["dimensions"]
        self.ann: str = meta["ann"]
        self.rows: int = meta["rows"]
        self.ranges = None if meta["int8_ranges"] is None else np.array(meta["int8_ranges"], "f4")
        self._segments = [
            _Segment(
                s["name"],
                s["offset"],
                s["rows"],
                np.load(layout.segment_dir(root, s["name"]) / "vectors.npy", mmap_mode="r"),
                TextStore(layout.segment_dir(root, s["name"]) / "texts.sqlite"),
            )
            for s in meta["segments"]
        ]
        self._offsets = np.array([s.offset for s in self._segments], dtype=np.int64)
        folder = layout.generation_dir(root, generation)
        self._graph = engine.open_graph(folder / "hnsw.usearch") if self.ann == "hnsw" else None
        self._stored = None if self.ann == "hnsw" else _stored_arrays(root, meta)

    @classmethod
    def open(cls, path: str | os.PathLike, encoder=None) -> VectorIndex:
        """Open the committed index at ``path``; with an ``encoder``, check first that it is
        the model the index was built with (:class:`~.identity.ModelMismatchError` if not)."""
        root = Path(path)
        for attempt in range(_OPEN_TRIES):
            generation = layout.current_generation(root)
            if generation is None:
                raise IndexNotFoundError(_not_found(root))
            try:
                meta = layout.read_json(layout.generation_dir(root, generation) / "meta.json")
                index = cls(root, generation, meta)
                break
            except FileNotFoundError:
                # Two commits since CURRENT was read removed that generation: read it again.
                if attempt == _OPEN_TRIES - 1:
                    raise
        if encoder is not None:
            index = index.with_encoder(encoder)
        return index

    def with_encoder(self, encoder) -> VectorIndex:
        """This index with ``encoder`` for text queries, after checking it is the index's model."""
        self.identity.check_same(ModelIdentity.of(encoder), f"index {self.root}")
        self.encoder = encoder
        return self

    def embed_queries(self, queries: Sequence[str]) -> np.ndarray:
        """(Q, d) unit float32 query vectors, embedded as the index's texts were."""
        if self.encoder is None:
            raise ValueError(
                "this index was opened without an encoder: open it with "
                "VectorIndex.open(path, encoder) to search by text, or use search_vectors"
            )
        return truncate(self.encoder.encode(list(queries), normalize=True), self.dimensions)

    def search(
        self,
        queries: str | Sequence[str],
        k: int = 10,
        *,
        expansion_search: int | None = None,
        rescore_multiplier: int | None = None,
    ) -> list[Hit] | list[list[Hit]]:
        """The ``k`` texts closest to each query, best first (a list of hits for one query
        string, a list of lists for a list of queries)."""
        single = isinstance(queries, str)
        batch = [queries] if single else list(queries)
        vectors = self.embed_queries(batch)
        rows, scores = self.search_vectors(
            vectors, k, expansion_search=expansion_search, rescore_multiplier=rescore_multiplier
        )
        hits = self.hits(rows, scores)
        return hits[0] if single else hits

    def search_vectors(
        self,
        queries: np.ndarray,
        k: int = 10,
        *,
        expansion_search: int | None = None,
        rescore_multiplier: int | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(Q, d) unit float32 queries -> (Q, k) int64 rows (-1 where fewer) and (Q, k) float32
        cosines, best first; ties keep row order."""
        if isinstance(k, bool) or not isinstance(k, int) or k <= 0:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        queries = np.ascontiguousarray(queries, dtype=np.float32)
        if queries.ndim != 2 or queries.shape[1] != self.dimensions:
            raise ValueError(
                f"queries must be (Q, {self.dimensions}) float32 unit vectors, got shape "
                f"{queries.shape}"
            )
        rescore = rescore_multiplier or self.options.rescore
        expansion = expansion_search or self.options.expansion_search
        count = min(k * rescore, self.rows)
        stored_queries = quantize(queries, self.options.storage, self.ranges)
        if self._graph is not None:
            candidates = engine.search_graph(self._graph, stored_queries, count, expansion)
        else:
            candidates = engine.scan(self._stored, stored_queries, count, self.options.storage)
        rows = np.full((len(queries), k), -1, dtype=np.int64)
        scores = np.full((len(queries), k), np.nan, dtype=np.float32)
        for i, found in enumerate(candidates):
            found = found[found >= 0]
            exact = self.vectors(found) @ queries[i]  # (c,) float32 cosines
            order = np.lexsort((found, -exact))[:k]  # by score, then by row
            rows[i, : len(order)] = found[order]
            scores[i, : len(order)] = exact[order]
        return rows, scores

    def vectors(self, rows: np.ndarray) -> np.ndarray:
        """(n, d) float32 vectors of global ``rows``."""
        rows = np.asarray(rows, dtype=np.int64)
        out = np.empty((len(rows), self.dimensions), dtype=np.float32)
        where = np.searchsorted(self._offsets, rows, side="right") - 1
        for s in np.unique(where):
            picked = where == s
            segment = self._segments[s]
            local = rows[picked] - segment.offset
            order = np.argsort(local)  # memory-mapped rows read in file order
            block = np.empty((len(local), self.dimensions), dtype=np.float32)
            block[order] = segment.vectors[local[order]]
            out[picked] = block
        return out

    def hits(self, rows: np.ndarray, scores: np.ndarray) -> list[list[Hit]]:
        """Rows and scores from :meth:`search_vectors` as :class:`Hit` lists, with texts."""
        wanted = sorted({int(r) for r in rows.ravel() if r >= 0})
        found: dict[int, tuple[str, str]] = {}
        where = np.searchsorted(self._offsets, np.array(wanted, dtype=np.int64), side="right") - 1
        for s in np.unique(where):
            segment = self._segments[s]
            local = [r - segment.offset for r, w in zip(wanted, where, strict=True) if w == s]
            for row, value in segment.texts.get(local).items():
                found[row + segment.offset] = value
        return [
            [
                Hit(float(score), *found[int(row)], int(row))
                for row, score in zip(query_rows, query_scores, strict=True)
                if row >= 0
            ]
            for query_rows, query_scores in zip(rows, scores, strict=True)
        ]

    def stats(self) -> IndexStats:
        folder = layout.generation_dir(self.root, self.generation)
        disk = _folder_bytes(folder) + sum(
            _folder_bytes(layout.segment_dir(self.root, s.name)) for s in self._segments
        )
        if self._graph is not None:
            memory = (folder / "hnsw.usearch").stat().st_size
        else:
            memory = int(self._stored.nbytes)
        return IndexStats(
            rows=self.rows,
            dimensions=self.dimensions,
            storage=self.options.storage,
            ann=self.ann,
            stored_bytes_per_vector=stored_bytes(self.options.storage, self.dimensions),
            memory_bytes=memory,
            disk_bytes=disk,
        )

    def __repr__(self) -> str:
        return (
            f"VectorIndex({str(self.root)!r}, generation={self.generation!r}, rows={self.rows}, "
            f"dimensions={self.dimensions}, storage={self.options.storage!r}, ann={self.ann!r}, "
            f"model={self.identity.name!r})"
        )


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
                engine.add_to_graph(graph, entry["offset"], _stored(root, entry, options.storage))
            engine.save_graph(graph, folder / "hnsw.usearch")
            log.info("graph of %d vectors saved in %.1fs", rows, time.perf_counter() - started)
        layout.write_json(folder / "meta.json", meta)
    return name


def _stored(root: Path, segment: dict, storage: str) -> np.ndarray:
    folder = layout.segment_dir(root, segment["name"])
    name = "vectors.npy" if storage == "float32" else "stored.npy"
    return np.load(folder / name, mmap_mode="r")


def _stored_arrays(root: Path, meta: dict) -> np.ndarray:
    """Every segment's stored vectors in one array, for an exact scan (small indexes)."""
    storage = meta["options"]["storage"]
    parts = [np.asarray(_stored(root, s, storage)) for s in meta["segments"]]
    return np.ascontiguousarray(np.concatenate(parts))


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


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


def _not_found(root: Path) -> str:
    if not root.exists():
        return f"no index at {root}: build one with `clearformer index build`"
    if (root / "staging").is_dir():
        return (
            f"{root} holds no committed index yet (a build was stopped before its commit); "
            "run the same build again to resume it"
        )
    return f"{root} is not an index directory (no {layout.CURRENT} file)"
