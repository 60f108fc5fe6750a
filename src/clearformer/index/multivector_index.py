"""A multi-vector (ColBERT-style) index: MUVERA encodings in usearch find candidates, exact
MaxSim over the stored token vectors ranks them.

Each document's token vectors are kept whole, in one memory-mapped (tokens, D) float32 array
with (n + 1,) row offsets, and as one MUVERA fixed-dimensional encoding (:mod:`.muvera`),
whose dot product with a query's encoding approximates MaxSim. A search encodes the query,
takes the ``candidates`` documents of largest encoding dot product (usearch's HNSW graph, or
an exact scan of the encodings for a small index), then scores exactly those with MaxSim
(the formula of :func:`clearformer.retrieval.maxsim.maxsim_scores`, here on the
memory-mapped token matrix) and returns the best ``k``. Every score
returned is the exact MaxSim; only the candidate set is approximate, and its recall of the
exact top k rises with ``candidates`` (tests/test_muvera.py, benchmarks/multivector_index.py).
PLAID was not taken: no PyPI implementation installs without a GPU toolchain (docs/hybrid.md).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import engine, integrity, layout
from .kind_index import KindIndex
from .kind_store import EncodeChunk, model_precision, write_kind
from .kinds import encoder_for, identity_of
from .muvera import Muvera, MuveraConfig
from .options import ANN_MODES, resolve_ann
from .ragged import Ragged, concatenate, token_rows

TOKENS = "tokens.npy"  # (total tokens, D) float32: every document's token vectors
TOKEN_INDPTR = "token_indptr.npy"  # (n + 1,) int64: document i's tokens start here
ENCODINGS = "fde.npy"  # (n, F) float32 MUVERA encodings
GRAPH = "fde.usearch"  # HNSW over the encodings (ann = hnsw)
_SCORE_BLOCK = 2048  # documents scored per MaxSim product in an exact search


@dataclass(frozen=True)
class MultiVectorOptions:
    """How a multi-vector index is built and, by default, searched."""

    repetitions: int = 10  # MUVERA: independent partitionings (see muvera.MuveraConfig)
    simhash_bits: int = 4  # MUVERA: 16 partitions per repetition
    projection: int | None = 16  # MUVERA: values per partition: 10 * 16 * 16 = 2,560 in all
    final_dimensions: int | None = None
    seed: int = 0
    candidates: int = 200  # encodings' best documents rescored by exact MaxSim per query
    # auto: exact scan of the encodings up to options.EXACT_MAX_ROWS rows, else hnsw (resolved
    # at each build and add from the rows then held: an add past the mark builds the graph)
    ann: str = "auto"
    connectivity: int = 16  # HNSW, as IndexOptions
    expansion_add: int = 128
    expansion_search: int = 256
    chunk_rows: int = 1024  # texts encoded per committed chunk

    def __post_init__(self) -> None:
        if self.ann not in ANN_MODES:
            raise ValueError(f"ann must be one of {ANN_MODES}, got {self.ann!r}")
        for name in (
            "candidates",
            "connectivity",
            "expansion_add",
            "expansion_search",
            "chunk_rows",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")

    def ann_for(self, rows: int) -> str:
        """The search an index of ``rows`` documents runs: ``exact`` or ``hnsw``."""
        return resolve_ann(self.ann, rows)

    def muvera(self, dim: int) -> MuveraConfig:
        return MuveraConfig(
            dim=dim,
            repetitions=self.repetitions,
            simhash_bits=self.simhash_bits,
            projection=self.projection,
            final_dimensions=self.final_dimensions,
            seed=self.seed,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def build_multivector(
    root: Path,
    texts: list[str],
    ids: list[str],
    encoder: Any,
    options: MultiVectorOptions,
    *,
    on_chunk=None,
    progress: Any = None,
    batch_size: int | None = None,
) -> MultiVectorIndex:
    view = encoder_for("multivector", encoder, "encoder")
    identity = identity_of(view)
    muvera = Muvera(options.muvera(identity.width))  # checks the settings before any work
    ann = options.ann_for(len(texts))
    if ann == "hnsw":
        engine.usearch_index_module()  # a missing engine fails now, not after encoding
    write_kind(
        root,
        "multivector",
        texts,
        ids,
        model=identity.to_dict(),
        options=options.to_dict(),  # as asked: "auto" is resolved again by each add
        write_files=lambda folder, rows: write_multivector_files(
            folder, rows, muvera, ann, options
        ),
        reader=MultiVectorIndex,
        encode=multivector_encode(view, identity.width, batch_size),
        precision=model_precision(view),
        chunk_rows=options.chunk_rows,
        on_chunk=on_chunk,
        progress=progress,
    )
    return MultiVectorIndex.open(root, encoder)


def multivector_encode(view: Any, width: int, batch_size: int | None) -> EncodeChunk:
    """A chunk of texts -> their documents' token vectors, by the multi-vector model ``view``."""

    def encode(chunk: list[str], chunk_progress: Any) -> Ragged:
        return token_rows(
            view.encode_document(chunk, batch_size=batch_size, progress=chunk_progress), width
        )

    return encode


def write_multivector_files(
    folder: Path, rows: Ragged, muvera: Muvera, ann: str, options: MultiVectorOptions
) -> None:
    """A generation's files for the documents' token ``rows``: the tokens, their offsets, the
    MUVERA encodings and (``ann`` hnsw) the graph over them."""
    np.save(folder / TOKENS, rows.values.astype(np.float32))
    np.save(folder / TOKEN_INDPTR, rows.indptr.astype(np.int64))
    encodings = np.ascontiguousarray(muvera.encode_documents(rows), dtype=np.float32)
    np.save(folder / ENCODINGS, encodings)
    if ann == "hnsw":
        _write_graph(folder, encodings, options)


def _write_graph(folder: Path, encodings: np.ndarray, options: MultiVectorOptions) -> None:
    """The HNSW graph over every one of ``encodings`` (n, F) float32, saved in ``folder``."""
    graph = engine.new_graph("float32", encodings.shape[1], options)
    engine.add_to_graph(graph, 0, encodings)
    engine.save_graph(graph, folder / GRAPH)


def extend_multivector_files(
    folder: Path, previous: Path, meta: dict[str, Any], rows: Ragged, width: int
) -> None:
    """The files of ``previous`` (a committed generation, its ``meta``) with the documents'
    token ``rows`` after its own. A document's MUVERA encoding depends on its tokens alone, so
    only the new rows are encoded, and their encodings are inserted into the previous graph
    (loaded, as the dense add does): an add costs its own rows, not the index's, but for the
    add that takes an ``auto`` index past :data:`~.options.EXACT_MAX_ROWS`, which builds the
    graph over every encoding."""
    options = MultiVectorOptions(**meta["options"])
    held = Ragged(np.load(previous / TOKEN_INDPTR), np.load(previous / TOKENS, mmap_mode="r"))
    both = concatenate([held, rows])
    np.save(folder / TOKENS, both.values.astype(np.float32))
    np.save(folder / TOKEN_INDPTR, both.indptr.astype(np.int64))
    added = Muvera(options.muvera(width)).encode_documents(rows)  # (new rows, F)
    encodings = np.concatenate([np.load(previous / ENCODINGS), added]).astype(np.float32)
    np.save(folder / ENCODINGS, encodings)
    if options.ann_for(len(encodings)) != "hnsw":
        return
    if options.ann_for(meta["rows"]) != "hnsw":  # past the exact scan's mark: once
        _write_graph(folder, encodings, options)
        return
    graph = engine.open_graph(previous / GRAPH, view=False)
    engine.add_to_graph(graph, meta["rows"], np.ascontiguousarray(added, dtype=np.float32))
    engine.save_graph(graph, folder / GRAPH)


class MultiVectorIndex(KindIndex):
    """A committed multi-vector index: MUVERA candidates, exact MaxSim scores."""

    kind = "multivector"

    def __init__(self, root: Path, encoder: Any = None) -> None:
        super().__init__(root, encoder)
        self.options = self.from_meta(
            "'options'", lambda: MultiVectorOptions(**self.meta["options"])
        )
        self.width: int = self.identity.width
        self.muvera = self.from_meta(
            "MUVERA 'options'", lambda: Muvera(self.options.muvera(self.width))
        )
        load = lambda name: np.load(self.folder / name, mmap_mode="r")  # noqa: E731
        self._tokens = load(TOKENS)  # (T, D)
        self._indptr = np.asarray(load(TOKEN_INDPTR))  # (n + 1,)
        self._encodings = load(ENCODINGS)  # (n, F)
        meta_path = self.folder / layout.META
        if len(self._indptr) != self.rows + 1 or self._indptr[-1] != len(self._tokens):
            raise layout.IndexDamagedError(
                self.folder / TOKEN_INDPTR,
                f"does not hold {self.rows + 1} offsets ending at {len(self._tokens)} tokens",
            )
        self._graph = None
        if self.options.ann_for(self.rows) == "hnsw":
            self._graph = integrity.open_graph(
                self.folder / GRAPH, self.rows, self._encodings.shape[1], "float32", meta_path
            )

    def search_texts(self, queries: list[str], k: int, **how: Any) -> tuple[np.ndarray, np.ndarray]:
        encoded = token_rows(self._require_encoder().encode_query(queries), self.width)
        return self.search_vectors(encoded, k, **how)

    def search_vectors(
        self, queries: Ragged, k: int, *, candidates: int | None = None, exact: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """Query token rows -> (Q, k) int64 rows (-1 where fewer) and (Q, k) float32 MaxSim,
        best first, ties by row. ``exact``: MaxSim against every document (the reference)."""
        count = min(max(candidates or self.options.candidates, k), self.rows)
        found = None if exact else self.candidates(queries, count)  # (Q, count)
        out_rows = np.full((queries.rows, k), -1, dtype=np.int64)
        out_scores = np.full((queries.rows, k), np.nan, dtype=np.float32)
        for i in range(queries.rows):
            _, query = queries.row(i)
            rows = np.arange(self.rows) if exact else found[i][found[i] >= 0]
            scores = self.maxsim(query, rows)  # (c,)
            order = np.lexsort((rows, -scores))[:k]
            out_rows[i, : len(order)] = rows[order]
            out_scores[i, : len(order)] = scores[order]
        return out_rows, out_scores

    def candidates(self, queries: Ragged, count: int) -> np.ndarray:
        """(Q, count) int64 rows of the largest MUVERA dot products, -1 where fewer."""
        encoded = np.ascontiguousarray(self.muvera.encode_queries(queries), dtype=np.float32)
        if self._graph is not None:
            exact = engine.graph_scans(count, self.rows, self.options.connectivity)
            return engine.search_graph(
                self._graph, encoded, count, self.options.expansion_search, exact=exact
            )
        return engine.scan(np.asarray(self._encodings), encoded, count, "float32")

    def maxsim(self, query: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """(c,) float32 exact MaxSim of one (Tq, D) query against documents ``rows``:
        ``sum_i max_j q_i . d_j`` (``clearformer.retrieval.maxsim``'s formula; the tests hold
        this to it), a block of documents per matrix product."""
        query = np.ascontiguousarray(query, dtype=np.float32)
        out = np.zeros(len(rows), dtype=np.float32)
        for start in range(0, len(rows), _SCORE_BLOCK):
            block = np.asarray(rows[start : start + _SCORE_BLOCK], dtype=np.int64)
            starts, ends = self._indptr[block], self._indptr[block + 1]
            lengths = ends - starts  # (b,)
            filled = lengths > 0  # an empty document scores 0
            if not filled.any():
                continue
            if (np.diff(block) == 1).all():  # consecutive rows (an exact search): one slice
                tokens = np.asarray(self._tokens[starts[0] : ends[-1]])  # (sum Td, D)
            else:
                spans = [np.arange(s, e) for s, e in zip(starts[filled], ends[filled], strict=True)]
                tokens = np.asarray(self._tokens[np.concatenate(spans)])  # (sum Td, D)
            similarity = query @ tokens.T  # (Tq, sum Td)
            offsets = np.concatenate([[0], np.cumsum(lengths[filled])[:-1]])  # (f,)
            best = np.maximum.reduceat(similarity, offsets, axis=1)  # (Tq, f) per document
            out[start + np.flatnonzero(filled)] = best.sum(axis=0)
        return out
