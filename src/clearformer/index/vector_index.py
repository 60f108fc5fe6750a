"""``VectorIndex``: a committed generation of an index directory, opened for search.

Readers, any number, take no lock: read ``CURRENT`` once, memory-map that generation's graph
and the segments' float32 vectors, find ``k * rescore`` candidates in the stored vectors
(graph or exact scan), rescore them with the float32 vectors, and return the best ``k`` with
their ids and texts. A score is always the float32 cosine of the query and the text. Writing
is :mod:`.build`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import engine, integrity, layout
from .identity import ModelIdentity
from .kinds import encoder_for, identity_of
from .options import IndexOptions
from .quantize import quantize, stored_bytes, truncate
from .texts import TextStore

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
    stored: np.ndarray  # what an exact scan reads: the vectors, or their int8 / binary copy
    texts: TextStore
    vectors_path: Path


class VectorIndex:
    """A committed generation of an index directory, opened for search.

    Open with :meth:`open` (or ``TextEncoder.open_index``); make one with :func:`build_index`.
    The object keeps reading the generation it opened, whatever writers commit later.
    """

    def __init__(self, root: Path, generation: str, meta: dict[str, Any], encoder=None) -> None:
        """The generation ``generation`` of ``root``, whose checked ``meta.json`` is ``meta``
        (:func:`.integrity.read_meta`): each of its files is checked against it here
        (:class:`~.layout.IndexDamagedError` naming the file)."""
        self.root = root
        self.generation = generation
        self.meta = meta
        self.encoder = encoder
        folder = layout.generation_dir(root, generation)
        meta_path = folder / layout.META
        try:
            self.identity = ModelIdentity.from_dict(meta["model"])
            self.options = IndexOptions.from_dict(meta["options"])
        except (TypeError, ValueError) as exc:
            raise layout.IndexDamagedError(meta_path, f"holds an invalid field ({exc})") from None
        self.dimensions: int = meta["dimensions"]
        self.ann: str = meta["ann"]
        self.rows: int = meta["rows"]
        self.ranges = None if meta["int8_ranges"] is None else np.array(meta["int8_ranges"], "f4")
        storage = self.options.storage
        # In the order of layout.index_files: the graph, then each segment's files.
        self._graph = (
            integrity.open_graph(
                folder / layout.GRAPH, self.rows, self.dimensions, storage, meta_path
            )
            if self.ann == "hnsw"
            else None
        )
        self._segments = [self._open_segment(s, meta_path) for s in meta["segments"]]
        self._offsets = np.array([s.offset for s in self._segments], dtype=np.int64)
        self._stored = None if self.ann == "hnsw" else _stored_arrays(self._segments)

    def _open_segment(self, record: dict[str, Any], meta_path: Path) -> _Segment:
        folder = layout.segment_dir(self.root, record["name"])
        rows, storage = record["rows"], self.options.storage
        vectors = integrity.open_array(
            folder / layout.VECTORS, rows, self.dimensions, "float32", meta_path
        )
        stored = vectors
        if storage != "float32":
            width = stored_bytes(storage, self.dimensions)
            dtype = "int8" if storage == "int8" else "uint8"
            stored = integrity.open_array(folder / layout.STORED, rows, width, dtype, meta_path)
        integrity.check_texts(folder / layout.TEXTS, rows, meta_path)
        integrity.check_segment_record(folder / layout.SEGMENT_RECORD, record, meta_path)
        return _Segment(
            record["name"],
            record["offset"],
            rows,
            vectors,
            stored,
            TextStore(folder / layout.TEXTS),
            folder / layout.VECTORS,
        )

    @classmethod
    def open(cls, path: str | os.PathLike, encoder=None) -> VectorIndex:
        """Open the committed index at ``path``; with an ``encoder``, check first that it is
        the model the index was built with (:class:`~.identity.ModelMismatchError` if not).

        Raises:
            IndexNotFoundError: no committed index at ``path``.
            IndexDamagedError: one of its files is missing, unreadable or disagrees with
                ``meta.json`` (a ``ValueError`` naming the file).
        """
        root = Path(path)
        for attempt in range(_OPEN_TRIES):
            generation = layout.current_generation(root)
            if generation is None:
                raise IndexNotFoundError(_not_found(root))
            folder = layout.generation_dir(root, generation)
            try:
                meta = integrity.read_meta(folder / layout.META, generation, FORMAT)
                index = cls(root, generation, meta)
                break
            except layout.IndexDamagedError:
                # A missing file may be a race, not damage: two commits since CURRENT was read
                # removed that generation. Damage is what stays when CURRENT has not moved.
                if attempt == _OPEN_TRIES - 1 or layout.current_generation(root) == generation:
                    raise
        if encoder is not None:
            index = index.with_encoder(encoder)
        return index

    def with_encoder(self, encoder) -> VectorIndex:
        """This index with ``encoder`` for text queries, after checking it is the index's model
        (a BGE-M3 model: its dense view)."""
        encoder = encoder_for("dense", encoder, f"index {self.root}")
        self.identity.check_same(identity_of(encoder), f"index {self.root}")
        self.encoder = encoder
        return self

    def embed_queries(self, queries: Sequence[str], precision: str | None = None) -> np.ndarray:
        """(Q, d) unit float32 query vectors, embedded as the index's texts were (normalised,
        cut to its width), in ``precision`` (as ``encode`` takes it; None: the encoder's)."""
        if self.encoder is None:
            raise ValueError(
                "this index was opened without an encoder: open it with "
                "VectorIndex.open(path, encoder) to search by text, or use search_vectors"
            )
        vectors = self.encoder.encode(list(queries), normalize=True, precision=precision)
        return truncate(vectors, self.dimensions)

    def search(
        self,
        queries: str | Sequence[str],
        k: int = 10,
        *,
        expansion_search: int | None = None,
        rescore_multiplier: int | None = None,
        precision: str | None = None,
    ) -> list[Hit] | list[list[Hit]]:
        """The ``k`` texts closest to each query, best first (a list of hits for one query
        string, a list of lists for a list of queries); the queries embedded in ``precision``
        (None: the encoder's)."""
        single = isinstance(queries, str)
        batch = [queries] if single else list(queries)
        k = hits_wanted(k, self.rows)
        vectors = self.embed_queries(batch, precision)
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
        given = {"k": k, "expansion_search": expansion_search}
        given["rescore_multiplier"] = rescore_multiplier  # the overrides: None = the index's own
        for name, value in given.items():
            wrong = isinstance(value, bool) or not isinstance(value, int) or value <= 0
            if wrong and (name == "k" or value is not None):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
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
            # A large share of the rows: a scan of the graph's vectors (engine.graph_scans).
            exact = engine.graph_scans(count, self.rows, self.options.connectivity)
            candidates = engine.search_graph(
                self._graph, stored_queries, count, expansion, exact=exact
            )
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
            _check_unit_rows(block, local, segment.vectors_path)
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
        missing = [row for row in wanted if row not in found]
        if missing:
            segment = self._segments[int(np.searchsorted(self._offsets, missing[0], "right") - 1)]
            raise layout.IndexDamagedError(
                segment.texts.path, f"holds no row {missing[0] - segment.offset}"
            )
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
            memory = (folder / layout.GRAPH).stat().st_size
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


def stored_vectors(root: Path, segment: dict, storage: str) -> np.ndarray:
    """A segment's stored vectors (what the graph holds), memory-mapped."""
    folder = layout.segment_dir(root, segment["name"])
    return np.load(folder / layout.stored_name(storage), mmap_mode="r")


def _stored_arrays(segments: list[_Segment]) -> np.ndarray:
    """Every segment's stored vectors in one array, for an exact scan (small indexes)."""
    return np.ascontiguousarray(np.concatenate([np.asarray(s.stored) for s in segments]))


def _check_unit_rows(block: np.ndarray, rows: np.ndarray, path: Path) -> None:
    """Rows read for rescoring are unit vectors (or zero): bytes overwritten inside
    ``vectors.npy``, which no header shows, are found when a search reads them."""
    with np.errstate(over="ignore", invalid="ignore"):  # garbage may overflow: found below
        norms = np.linalg.norm(block, axis=1)  # (n,)
    bad = ~(np.isfinite(norms) & ((np.abs(norms - 1) < 1e-3) | (norms == 0)))
    if bad.any():
        row = int(rows[int(np.argmax(bad))])
        raise layout.IndexDamagedError(
            path, f"holds row {row}, which is not a unit vector (norm {norms[bad][0]:.4g})"
        )


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
    if (root / "generations").is_dir():
        return (
            f"{root} holds no committed index: {root / layout.CURRENT} is missing or empty; "
            "run the same build again to rebuild it"
        )
    return f"{root} is not an index directory (no {layout.CURRENT} file)"


def hits_wanted(k: Any, rows: int) -> int:
    """``k`` checked (a positive integer, else ValueError naming it, before any work) and
    held to the index's ``rows``: a search returns no more hits than texts, and a ``k`` far
    above them would only size empty result arrays (a ``k`` of 10^11 asks for hundreds of
    GiB)."""
    if isinstance(k, bool) or not isinstance(k, int) or k <= 0:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    return min(k, max(rows, 1))
