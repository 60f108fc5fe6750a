"""A sparse (SPLADE-style) index: an inverted index of the documents' term weights, searched
exactly (or with Seismic's candidates, rescored exactly).

A document is a few hundred (term id, weight) pairs over the model's vocabulary; a query a
few dozen. The score is their dot product, ``sum_t q_t * d_t`` over the terms both hold. The
index keeps, per term, its posting list: the rows that hold the term and their weights, in
three memory-mapped arrays (CSC layout of the (rows, vocab) matrix). A query reads only the
posting lists of its own terms and accumulates ``q_t * d_t`` per row (term at a time, one
``bincount``), so a search touches the documents that share a term with the query and no
other: exact, with no approximation to tune. ``benchmarks/sparse_index.py`` measures it
against a brute-force product of the whole matrix and against Seismic (``pyseismic-lsr``),
an approximate engine; docs/hybrid.md says why this is the default. With
``SparseOptions(engine="seismic")`` the index also keeps Seismic's index and the documents'
own rows (doc-major), and a search takes Seismic's ``candidates`` and rescores them with the
exact dot product (:mod:`.sparse_seismic`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import layout
from .kind_index import KindIndex, top_k
from .kind_store import EncodeChunk, model_precision, write_kind
from .kinds import encoder_for, identity_of
from .ragged import Ragged, concatenate, sparse_rows
from .sparse_seismic import FILE as SEISMIC_FILE
from .sparse_seismic import open_seismic, seismic_candidates, seismic_module, write_seismic

log = logging.getLogger(__name__)

POSTINGS_INDPTR = "postings_indptr.npy"  # (vocab + 1,) int64: term t's postings start here
POSTINGS_ROWS = "postings_rows.npy"  # (nnz,) int32: the rows holding each term, ascending
POSTINGS_WEIGHTS = "postings_weights.npy"  # (nnz,) float32: their weights
# engine="seismic": the documents' own rows, for rescoring Seismic's candidates exactly
DOCUMENT_INDPTR = "document_indptr.npy"  # (n + 1,) int64: row i's terms start here
DOCUMENT_TERMS = "document_terms.npy"  # (nnz,) int32
DOCUMENT_WEIGHTS = "document_weights.npy"  # (nnz,) float32
ENGINES = ("exact", "seismic")


@dataclass(frozen=True)
class SparseOptions:
    """How a sparse index is built."""

    chunk_rows: int = 4096  # texts encoded per committed chunk: what a killed build resumes from
    engine: str = "exact"  # exact: posting lists accumulated; seismic: its candidates, rescored
    candidates: int = 100  # seismic: candidates per query, rescored exactly (at least k)
    query_cut: int = 20  # seismic: the query's largest terms it reads (its benchmarks' value)
    heap_factor: float = 0.8  # seismic: how far below the k-th best a block is still read

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {self.engine!r}")
        for name in ("candidates", "query_cut"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not 0 < self.heap_factor <= 1:
            raise ValueError(f"heap_factor must be in (0, 1], got {self.heap_factor}")
        if isinstance(self.chunk_rows, bool) or not isinstance(self.chunk_rows, int):
            raise TypeError(f"chunk_rows must be an int, got {type(self.chunk_rows).__name__}")
        if self.chunk_rows <= 0:
            raise ValueError(f"chunk_rows must be a positive integer, got {self.chunk_rows}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def build_sparse(
    root: Path,
    texts: list[str],
    ids: list[str],
    encoder: Any,
    options: SparseOptions,
    *,
    on_chunk=None,
    progress: Any = None,
    batch_size: int | None = None,
) -> SparseIndex:
    view = encoder_for("sparse", encoder, "encoder")
    if options.engine == "seismic":
        seismic_module()  # a missing engine fails now, not after the encoding
    identity = identity_of(view)
    vocabulary = identity.width
    write_kind(
        root,
        "sparse",
        texts,
        ids,
        model=identity.to_dict(),
        options={**options.to_dict(), "vocabulary": vocabulary},
        write_files=lambda folder, rows: write_sparse_files(
            folder, rows, vocabulary, options.engine
        ),
        reader=SparseIndex,
        encode=sparse_encode(view, vocabulary, batch_size),
        precision=model_precision(view),
        chunk_rows=options.chunk_rows,
        on_chunk=on_chunk,
        progress=progress,
    )
    return SparseIndex.open(root, encoder)


def sparse_encode(view: Any, vocabulary: int, batch_size: int | None) -> EncodeChunk:
    """A chunk of texts -> their documents' (term, weight) rows, by the sparse model ``view``."""

    def encode(chunk: list[str], chunk_progress: Any) -> Ragged:
        rows = sparse_rows(
            view.encode_document(chunk, batch_size=batch_size, progress=chunk_progress)
        )
        _check_terms(rows, vocabulary, "the encoder")
        return rows

    return encode


def write_sparse_files(folder: Path, rows: Ragged, vocabulary: int, engine: str) -> None:
    """A generation's files for the documents' ``rows``: their posting lists, and with the
    seismic engine their own rows and Seismic's index."""
    indptr, postings, weights = invert(rows, vocabulary)
    np.save(folder / POSTINGS_INDPTR, indptr)
    np.save(folder / POSTINGS_ROWS, postings)
    np.save(folder / POSTINGS_WEIGHTS, weights)
    if engine == "seismic":
        np.save(folder / DOCUMENT_INDPTR, rows.indptr.astype(np.int64))
        np.save(folder / DOCUMENT_TERMS, rows.indices.astype(np.int32))
        np.save(folder / DOCUMENT_WEIGHTS, rows.values.astype(np.float32))
        write_seismic(folder, rows)


def extend_sparse_files(folder: Path, previous: Path, meta: dict[str, Any], rows: Ragged) -> None:
    """The files of ``previous`` (a committed generation, its ``meta``) with the documents'
    ``rows`` after its own: every file is written anew from all the rows, as a build of them
    writes it (a posting list is one run per term, so new rows cannot go at its end)."""
    vocabulary = meta["options"]["vocabulary"]
    held = committed_rows(previous, meta["rows"], vocabulary)
    write_sparse_files(folder, concatenate([held, rows]), vocabulary, meta["options"]["engine"])


def committed_rows(folder: Path, rows: int, vocabulary: int) -> Ragged:
    """A generation's documents as (term, weight) rows, read back from its posting lists (the
    inverse of :func:`invert`: terms ascending in each row, as the encoder gave them)."""
    indptr = np.load(folder / POSTINGS_INDPTR)  # (vocab + 1,)
    owner = np.load(folder / POSTINGS_ROWS)  # (nnz,)
    weights = np.load(folder / POSTINGS_WEIGHTS)  # (nnz,)
    terms = np.repeat(np.arange(vocabulary, dtype=np.int32), np.diff(indptr))  # (nnz,)
    order = np.lexsort((terms, owner))  # by row, then term
    counts = np.bincount(owner, minlength=rows)  # (rows,)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)  # (rows + 1,)
    return Ragged(offsets, weights[order], terms[order])


def invert(rows: Ragged, vocabulary: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Documents' (term, weight) rows as posting lists: (vocab + 1,) int64 offsets, (nnz,)
    int32 rows and (nnz,) float32 weights, each term's rows ascending."""
    owner = np.repeat(np.arange(rows.rows, dtype=np.int32), np.diff(rows.indptr))  # (nnz,)
    order = np.argsort(rows.indices, kind="stable")  # by term; rows stay ascending in a term
    counts = np.bincount(rows.indices, minlength=vocabulary)  # (vocab,)
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return indptr, owner[order], rows.values[order].astype(np.float32)


def _check_terms(rows: Ragged, vocabulary: int, source: str) -> None:
    if len(rows.indices) and (rows.indices.min() < 0 or rows.indices.max() >= vocabulary):
        raise ValueError(
            f"{source} gave a term id outside the vocabulary of {vocabulary}: "
            f"{int(rows.indices.max())}"
        )


class SparseIndex(KindIndex):
    """A committed sparse index, opened for search (exact, or Seismic's candidates rescored
    exactly)."""

    kind = "sparse"

    def __init__(self, root: Path, encoder: Any = None) -> None:
        super().__init__(root, encoder)
        self.vocabulary: int = self.from_meta("'options' vocabulary", self._recorded_vocabulary)
        self.options = self.from_meta(
            "'options'",
            lambda: SparseOptions(
                **{k: v for k, v in self.meta["options"].items() if k != "vocabulary"}
            ),
        )
        load = lambda name: np.load(self.folder / name, mmap_mode="r")  # noqa: E731
        self._indptr = np.asarray(load(POSTINGS_INDPTR))  # small: (vocab + 1,) in memory
        if len(self._indptr) != self.vocabulary + 1:  # a term id past it would read no list
            raise layout.IndexDamagedError(
                self.folder / POSTINGS_INDPTR,
                f"holds {len(self._indptr)} offsets, but {self.folder / layout.META} records "
                f"a vocabulary of {self.vocabulary} (its offsets: {self.vocabulary + 1})",
            )
        self._rows = load(POSTINGS_ROWS)
        self._weights = load(POSTINGS_WEIGHTS)
        self._seismic = None
        if self.options.engine == "seismic":
            self._documents = Ragged(
                np.asarray(load(DOCUMENT_INDPTR)), load(DOCUMENT_WEIGHTS), load(DOCUMENT_TERMS)
            )
            try:
                self._seismic = open_seismic(self.folder / SEISMIC_FILE)
            except BaseException as exc:
                # Seismic is Rust: a file it cannot read may raise pyo3's PanicException,
                # which derives from BaseException, not Exception.
                if not isinstance(exc, Exception) and type(exc).__name__ != "PanicException":
                    raise
                raise layout.IndexDamagedError(
                    self.folder / SEISMIC_FILE, f"cannot be loaded by Seismic ({exc})"
                ) from None

    def _recorded_vocabulary(self) -> int:
        """The vocabulary ``meta.json`` records: the model's width, which built the lists."""
        vocabulary = self.meta["options"].get("vocabulary")
        if isinstance(vocabulary, bool) or not isinstance(vocabulary, int):
            raise TypeError(f"{vocabulary!r:.40} is not the model's width, an integer")
        if vocabulary != self.identity.width:
            raise ValueError(f"{vocabulary} is not the model's width {self.identity.width}")
        return vocabulary

    def search_texts(self, queries: list[str], k: int, **how: Any) -> tuple[np.ndarray, np.ndarray]:
        encoded = sparse_rows(self._require_encoder().encode_query(queries))
        return self.search_vectors(encoded, k, **how)

    def search_vectors(
        self, queries: Ragged, k: int, *, exact: bool = False, candidates: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Sparse query rows -> (Q, k) int64 rows (-1 where fewer documents share a term)
        and (Q, k) float32 dot products, best first; ties by row. With the seismic engine,
        ``exact`` accumulates the posting lists instead (the reference)."""
        _check_terms(queries, self.vocabulary, "the query")
        out_rows = np.full((queries.rows, k), -1, dtype=np.int64)
        out_scores = np.full((queries.rows, k), np.nan, dtype=np.float32)
        count = max(candidates or self.options.candidates, k)
        for i in range(queries.rows):
            terms, weights = queries.row(i)
            if self._seismic is None or exact:
                out_rows[i], out_scores[i] = top_k(self.scores(terms, weights), k)
                continue
            found = seismic_candidates(
                self._seismic, terms, weights, count, self.options.query_cut,
                self.options.heap_factor,
            )  # fmt: skip
            exact_scores = self.rescore(terms, weights, found)  # (c,)
            keep = exact_scores > 0
            found, exact_scores = found[keep], exact_scores[keep]
            order = np.lexsort((found, -exact_scores))[:k]
            out_rows[i, : len(order)] = found[order]
            out_scores[i, : len(order)] = exact_scores[order]
        return out_rows, out_scores

    def rescore(self, terms: np.ndarray, weights: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """(c,) float64 exact dot products of one query with documents ``rows`` (from their
        stored rows: the seismic engine)."""
        query = np.zeros(self.vocabulary, dtype=np.float64)  # (vocab,) dense query
        query[terms] = weights
        out = np.zeros(len(rows), dtype=np.float64)
        indptr = self._documents.indptr
        starts, ends = indptr[rows], indptr[np.asarray(rows) + 1]
        filled = ends > starts
        if not filled.any():
            return out
        spans = np.concatenate([np.arange(s, e) for s, e in zip(starts, ends, strict=True)])
        products = query[self._documents.indices[spans]] * self._documents.values[spans]
        offsets = np.concatenate([[0], np.cumsum((ends - starts)[filled])[:-1]])  # (f,)
        out[filled] = np.add.reduceat(products, offsets)  # one sum per document
        return out

    def scores(self, terms: Sequence[int], weights: Sequence[float]) -> np.ndarray:
        """(n,) float64: every row's dot product with the query ``sum_t w_t * d_t``, read
        from the query terms' posting lists only."""
        starts, ends = self._indptr[terms], self._indptr[np.asarray(terms) + 1]
        if not len(terms) or not (ends - starts).any():
            return np.zeros(self.rows)
        rows = np.concatenate([self._rows[s:e] for s, e in zip(starts, ends, strict=True)])
        products = np.concatenate(
            [
                self._weights[s:e] * np.float32(w)
                for s, e, w in zip(starts, ends, weights, strict=True)
            ]
        )  # (postings read,) q_t * d_t
        return np.bincount(rows, weights=products, minlength=self.rows)
