"""Ragged rows: what a sparse or a multi-vector encoder makes of a list of texts, in one form.

A text's sparse vector is a few (term id, weight) pairs; its multi-vector is a few token
vectors. Both are rows of different lengths, kept CSR-style: ``indptr`` (n + 1,) says where
each row's entries start in ``values`` (and, for sparse rows, ``indices``). One form serves
the committed chunks a killed build resumes from (:class:`RaggedChunkStore`), their
concatenation into an index, and the files an index memory-maps.
"""

from __future__ import annotations

import logging
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..io import atomic_write
from .chunks import ChunkStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Ragged:
    """n rows of different lengths.

    indptr: (n + 1,) int64, row i's entries are ``indptr[i]:indptr[i + 1]``.
    values: (nnz,) float32 weights (sparse rows) or (nnz, D) float32 token vectors.
    indices: (nnz,) int32 term ids of sparse rows; None for token vectors.
    """

    indptr: np.ndarray
    values: np.ndarray
    indices: np.ndarray | None = None

    @property
    def rows(self) -> int:
        return len(self.indptr) - 1

    def arrays(self) -> dict[str, np.ndarray]:
        named = {"indptr": self.indptr, "values": self.values}
        if self.indices is not None:
            named["indices"] = self.indices
        return named

    def row(self, i: int) -> tuple[np.ndarray | None, np.ndarray]:
        """Row ``i``'s (indices or None, values)."""
        start, end = int(self.indptr[i]), int(self.indptr[i + 1])
        indices = None if self.indices is None else self.indices[start:end]
        return indices, self.values[start:end]


def sparse_rows(batch: Any) -> Ragged:
    """A sparse encoder's output, a (B, V) ``torch.sparse_coo_tensor``, as ragged rows (terms
    of each row in increasing id order)."""
    import torch

    if not isinstance(batch, torch.Tensor) or batch.layout != torch.sparse_coo:
        raise TypeError(
            f"a sparse encoder must return a torch.sparse_coo_tensor (B, vocab), got "
            f"{type(batch).__name__}"
        )
    batch = batch.coalesce()  # sorted (row, term) pairs, no repeats
    rows_of, terms = batch.indices().numpy()  # (nnz,) each
    values = batch.values().numpy().astype(np.float32)
    keep = values != 0  # stored zeros carry nothing; the contract says none are stored
    rows_of, terms, values = rows_of[keep], terms[keep], values[keep]
    counts = np.bincount(rows_of, minlength=batch.shape[0])  # (B,)
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return Ragged(indptr, values, terms.astype(np.int32))


def token_rows(batch: Sequence[Any], width: int | None = None) -> Ragged:
    """A multi-vector encoder's output, one (tokens_i, D) float32 tensor per text, as ragged
    rows."""
    arrays = [np.asarray(t.detach().cpu().numpy() if hasattr(t, "detach") else t) for t in batch]
    for i, array in enumerate(arrays):
        if array.ndim != 2 or (width is not None and array.shape[1] != width):
            raise ValueError(
                f"a multi-vector encoder must return (tokens, {width or 'D'}) matrices, got "
                f"shape {array.shape} for text {i}"
            )
    counts = [len(a) for a in arrays]
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    dim = arrays[0].shape[1] if arrays else (width or 0)
    values = np.concatenate(arrays).astype(np.float32) if arrays else np.zeros((0, dim), "f4")
    return Ragged(indptr, values)


def concatenate(parts: Sequence[Ragged]) -> Ragged:
    """The rows of ``parts``, in order, as one :class:`Ragged`."""
    shifts = np.cumsum([0] + [int(p.indptr[-1]) for p in parts[:-1]])
    indptr = np.concatenate(
        [parts[0].indptr[:1]] + [p.indptr[1:] + s for p, s in zip(parts, shifts, strict=True)]
    ).astype(np.int64)
    values = np.concatenate([p.values for p in parts])
    indices = None if parts[0].indices is None else np.concatenate([p.indices for p in parts])
    return Ragged(indptr, values, indices)


class RaggedChunkStore(ChunkStore):
    """Committed chunks of ragged rows, one ``.npz`` per chunk (written atomically, like the
    dense chunks); a damaged chunk is removed and encoded again."""

    def path(self, index: int) -> Path:
        return self.directory / f"chunk-{index:06d}.npz"

    def row_values(self, rows: Ragged) -> np.ndarray:
        """(n, 1) float32: NaN where a row holds a value that is not finite, else 0."""
        values = rows.values.reshape(len(rows.values), -1)  # (nnz, 1) or (nnz, D)
        bad_entries = np.flatnonzero(~np.isfinite(values).all(axis=1))
        flags = np.zeros((rows.rows, 1), dtype=np.float32)
        # The row of each entry: the last row whose start is at or before it.
        flags[np.searchsorted(rows.indptr, bad_entries, side="right") - 1] = np.nan
        return flags

    def write(self, index: int, rows: Any) -> None:
        if not isinstance(rows, Ragged):
            raise TypeError(f"chunk {index}: expected Ragged rows, got {type(rows).__name__}")
        with atomic_write(self.path(index), "wb") as handle:
            np.savez(handle, **rows.arrays())

    def read(self, index: int, mmap: bool = False) -> Ragged:
        with np.load(self.path(index)) as found:
            return Ragged(found["indptr"], found["values"], found.get("indices"))

    def _problem(self, index: int) -> str | None:
        rows, chunk_rows = self.job.get("rows"), self.job.get("chunk_rows")
        expected = min(chunk_rows, rows - index * chunk_rows)
        try:
            chunk = self.read(index)
        except FileNotFoundError:
            return "is missing"
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
            # BadZipFile (a chunk cut short, or its bytes changed) is none of the others
            return f"cannot be read ({type(exc).__name__})"
        if chunk.rows != expected or int(chunk.indptr[-1]) != len(chunk.values):
            return f"holds {chunk.rows} rows, expected {expected}"
        if not np.isfinite(chunk.values).all():
            return "holds values that are not finite"
        return None
