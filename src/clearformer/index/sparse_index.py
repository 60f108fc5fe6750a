"""A sparse (SPLADE-style) index: an inverted index of the documents' term weights, searched
exactly.

A document is a few hundred (term id, weight) pairs over the model's vocabulary; a query a
few dozen. The score is their dot product, ``sum_t q_t * d_t`` over the terms both hold. The
index keeps, per term, its posting list: the rows that hold the term and their weights, in
three memory-mapped arrays (CSC layout of the (rows, vocab) matrix). A query reads only the
posting lists of its own terms and accumulates ``q_t * d_t`` per row (term at a time, one
``bincount``), so a search touches the documents that share a term with the query and no
other: exact, with no approximation to tune. ``benchmarks/sparse_index.py`` measures it
against a brute-force product of the whole matrix and against Seismic (``pyseismic-lsr``),
an approximate engine; docs/hybrid.md says why this is the default.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .kind_index import KindIndex, top_k
from .kind_store import write_kind
from .kinds import encoder_for, identity_of
from .ragged import Ragged, sparse_rows

log = logging.getLogger(__name__)

POSTINGS_INDPTR = "postings_indptr.npy"  # (vocab + 1,) int64: term t's postings start here
POSTINGS_ROWS = "postings_rows.npy"  # (nnz,) int32: the rows holding each term, ascending
POSTINGS_WEIGHTS = "postings_weights.npy"  # (nnz,) float32: their weights


@dataclass(frozen=True)
class SparseOptions:
    """How a sparse index is built."""

    chunk_rows: int = 4096  # texts encoded per committed chunk: what a killed build resumes from

    def __post_init__(self) -> None:
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
    identity = identity_of(view)
    vocabulary = identity.width

    def encode(chunk: list[str], chunk_progress: Any) -> Ragged:
        rows = sparse_rows(
            view.encode_document(chunk, batch_size=batch_size, progress=chunk_progress)
        )
        _check_terms(rows, vocabulary, "the encoder")
        return rows

    def write_files(folder: Path, rows: Ragged | None) -> None:
        indptr, postings, weights = invert(rows, vocabulary)
        np.save(folder / POSTINGS_INDPTR, indptr)
        np.save(folder / POSTINGS_ROWS, postings)
        np.save(folder / POSTINGS_WEIGHTS, weights)

    write_kind(
        root,
        "sparse",
        texts,
        ids,
        model=identity.to_dict(),
        options={**options.to_dict(), "vocabulary": vocabulary},
        write_files=write_files,
        reader=SparseIndex,
        encode=encode,
        chunk_rows=options.chunk_rows,
        on_chunk=on_chunk,
        progress=progress,
    )
    return SparseIndex.open(root, encoder)


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
    """A committed sparse index, opened for exact search."""

    kind = "sparse"

    def __init__(self, root: Path, encoder: Any = None) -> None:
        super().__init__(root, encoder)
        self.vocabulary: int = self.meta["options"]["vocabulary"]
        load = lambda name: np.load(self.folder / name, mmap_mode="r")  # noqa: E731
        self._indptr = np.asarray(load(POSTINGS_INDPTR))  # small: (vocab + 1,) in memory
        self._rows = load(POSTINGS_ROWS)
        self._weights = load(POSTINGS_WEIGHTS)

    def search_texts(self, queries: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        encoded = sparse_rows(self._require_encoder().encode_query(queries))
        return self.search_vectors(encoded, k)

    def search_vectors(self, queries: Ragged, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Sparse query rows -> (Q, k) int64 rows (-1 where fewer documents share a term)
        and (Q, k) float32 dot products, best first; ties by row."""
        _check_terms(queries, self.vocabulary, "the query")
        out_rows = np.full((queries.rows, k), -1, dtype=np.int64)
        out_scores = np.full((queries.rows, k), np.nan, dtype=np.float32)
        for i in range(queries.rows):
            terms, weights = queries.row(i)
            scores = self.scores(terms, weights)  # (n,)
            out_rows[i], out_scores[i] = top_k(scores, k)
        return out_rows, out_scores

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
