"""MUVERA: a set of token vectors as one fixed-dimensional vector whose dot product
approximates MaxSim (Dhulipala et al. 2024, "MUVERA: Multi-Vector Retrieval via Fixed
Dimensional Encodings").

MaxSim sums, over query tokens q, the best ``q . d`` over document tokens d. MUVERA guesses
"the best d" without comparing: random hyperplanes (SimHash, ``simhash_bits`` of them) cut the
space into ``B = 2 ** simhash_bits`` partitions, and a query token is matched with the
document tokens that fall into its own partition. So per partition:

* a query keeps the **sum** of its tokens there (each query token counts once, as in MaxSim);
* a document keeps the **average** of its tokens there (MaxSim takes one document token per
  query token, not all of them), and an empty partition takes the document token whose SimHash
  bits are nearest in Hamming distance (so a query token is never matched with nothing);

and ``FDE(q) . FDE(d) = sum_partitions sum(q in p) . mean(d in p) ~ sum_q q . d*(q)``. Each
partition's block is shrunk by a random ±1 projection to ``projection`` values (scaled by
``1/sqrt(projection)`` so dot products are kept in expectation), the whole is repeated
``repetitions`` times with independent hyperplanes and projections (concatenated: the
estimates add, their noise averages out), and an optional final ±1 projection shrinks the
result to ``final_dimensions``. Every random matrix comes from ``seed``, so a query encoded at
search time meets the same partitions as the documents encoded at build time.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import cached_property
from typing import Any

import numpy as np

from .ragged import Ragged


@dataclass(frozen=True)
class MuveraConfig:
    """The encoding's shape: ``repetitions * 2**simhash_bits * projection`` values (or
    ``final_dimensions``)."""

    dim: int  # the token vectors' width D
    repetitions: int = 10  # independent partitionings, concatenated: more = less noise
    simhash_bits: int = 4  # hyperplanes per repetition: 2**bits partitions (paper: 3-6)
    projection: int | None = 16  # values per partition; None keeps D (no inner projection)
    final_dimensions: int | None = None  # a last ±1 projection of the whole encoding
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("dim", "repetitions", "simhash_bits", "projection", "final_dimensions"):
            value = getattr(self, name)
            if value is None and name in ("projection", "final_dimensions"):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.simhash_bits > 12:
            raise ValueError(f"simhash_bits must be at most 12, got {self.simhash_bits}")

    @property
    def partitions(self) -> int:
        return 2**self.simhash_bits

    @property
    def block(self) -> int:
        """Values per partition."""
        return self.projection or self.dim

    @property
    def dimensions(self) -> int:
        """The encoding's width."""
        return self.final_dimensions or self.repetitions * self.partitions * self.block

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Muvera:
    """Fixed-dimensional encodings of token-vector sets under one :class:`MuveraConfig`."""

    def __init__(self, config: MuveraConfig) -> None:
        self.config = config

    @cached_property
    def _matrices(self) -> tuple[list[np.ndarray], list[np.ndarray | None], np.ndarray | None]:
        c = self.config
        rng = np.random.default_rng(c.seed)
        planes, projections = [], []
        for _ in range(c.repetitions):
            planes.append(rng.standard_normal((c.dim, c.simhash_bits)).astype(np.float32))
            if c.projection is None:
                projections.append(None)
            else:
                signs = rng.choice(np.array([-1.0, 1.0], np.float32), (c.dim, c.projection))
                projections.append(signs / np.sqrt(c.projection, dtype=np.float32))
        final = None
        if c.final_dimensions is not None:
            width = c.repetitions * c.partitions * c.block
            signs = rng.choice(np.array([-1.0, 1.0], np.float32), (width, c.final_dimensions))
            final = signs / np.sqrt(c.final_dimensions, dtype=np.float32)
        return planes, projections, final

    def encode_queries(self, rows: Ragged) -> np.ndarray:
        """(n, dimensions) float32: per partition the sum of a query's tokens."""
        return self._encode(rows, document=False)

    def encode_documents(self, rows: Ragged) -> np.ndarray:
        """(n, dimensions) float32: per partition the mean of a document's tokens, empty
        partitions filled with the Hamming-nearest token."""
        return self._encode(rows, document=True)

    def _encode(self, rows: Ragged, document: bool) -> np.ndarray:
        c = self.config
        tokens = np.ascontiguousarray(rows.values, dtype=np.float32)  # (T, D), all texts
        if tokens.ndim != 2 or tokens.shape[1] != c.dim:
            raise ValueError(f"token vectors must be (T, {c.dim}), got shape {tokens.shape}")
        n, parts = rows.rows, c.partitions
        owner = np.repeat(np.arange(n), np.diff(rows.indptr))  # (T,) the text of each token
        weights = 1 << np.arange(c.simhash_bits)  # bit j of a partition's number
        planes, projections, final = self._matrices
        blocks = []
        for plane, projection in zip(planes, projections, strict=True):
            bits = tokens @ plane > 0  # (T, bits) the side of each hyperplane
            partition = bits.astype(np.int64) @ weights  # (T,) in [0, B)
            projected = tokens if projection is None else tokens @ projection  # (T, block)
            sums = np.zeros((n * parts, c.block), np.float32)  # (n * B, block)
            np.add.at(sums, owner * parts + partition, projected)
            if document:
                counts = np.bincount(owner * parts + partition, minlength=n * parts)  # (n * B,)
                sums /= np.maximum(counts, 1)[:, None]
                self._fill_empty(sums, counts, rows.indptr, bits, projected)
            blocks.append(sums.reshape(n, parts * c.block))  # (n, B * block)
        encoded = np.concatenate(blocks, axis=1)  # (n, R * B * block)
        return encoded if final is None else encoded @ final  # (n, dimensions)

    def _fill_empty(
        self,
        sums: np.ndarray,
        counts: np.ndarray,
        indptr: np.ndarray,
        bits: np.ndarray,
        projected: np.ndarray,
    ) -> None:
        """Each empty (text, partition) of a text with tokens takes the projected token whose
        bits differ least from the partition's number's bits."""
        parts = self.config.partitions
        codes = (np.arange(parts)[:, None] >> np.arange(self.config.simhash_bits)) & 1  # (B, bits)
        empty = (counts == 0).reshape(-1, parts)  # (n, B)
        for text in np.flatnonzero(empty.any(axis=1) & (np.diff(indptr) > 0)):
            start, end = int(indptr[text]), int(indptr[text + 1])
            missing = np.flatnonzero(empty[text])  # (m,) partitions
            # (m, t) Hamming distances between each missing partition and each token
            distance = (codes[missing][:, None, :] != bits[start:end][None, :, :]).sum(axis=2)
            nearest = start + np.argmin(distance, axis=1)  # (m,) first nearest token
            sums[text * parts + missing] = projected[nearest]
