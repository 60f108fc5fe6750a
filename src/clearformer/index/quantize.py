"""Compact vectors: Matryoshka truncation, int8 and binary storage.

The quantization follows sentence-transformers' ``quantize_embeddings``:

* ``int8``: per dimension, the calibration vectors' [min, max] is cut into 256 equal steps;
  a value becomes ``clip(floor((x - min) / step), 0, 255) - 128``. The ranges come from the
  vectors an index is built with and stay fixed, so vectors added later (and queries) that
  fall outside them are clipped, exactly as sentence-transformers does with given ``ranges``.
* ``binary``: one bit per dimension, set where the value is positive, packed eight to a byte
  (its ``"ubinary"``; its ``"binary"`` is the same bits shifted by -128 into int8).

Quantized vectors only choose candidates; every result is rescored with the float32 vectors
(kept on disk beside them), so a score is always the float32 cosine.
"""

from __future__ import annotations

import numpy as np

from .options import STORAGES


def truncate(vectors: np.ndarray, dimensions: int | None) -> np.ndarray:
    """(n, D) -> (n, dimensions) float32 unit rows: the first ``dimensions`` values of each row,
    L2-normalised again (Matryoshka truncation). ``None`` keeps every dimension."""
    vectors = np.asarray(vectors, dtype=np.float32)
    if dimensions is not None and dimensions < vectors.shape[1]:
        vectors = vectors[:, :dimensions]
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)  # (n, 1)
    return np.ascontiguousarray(vectors / np.maximum(norms, 1e-12), dtype=np.float32)


def int8_ranges(vectors: np.ndarray) -> np.ndarray:
    """(2, d) float32: the per-dimension min and max of ``vectors`` (n, d)."""
    if len(vectors) < 2:
        raise ValueError(
            f"int8 storage needs at least 2 vectors to calibrate its ranges, got {len(vectors)}"
        )
    return np.vstack([vectors.min(axis=0), vectors.max(axis=0)]).astype(np.float32)


def quantize(vectors: np.ndarray, storage: str, ranges: np.ndarray | None = None) -> np.ndarray:
    """(n, d) float32 -> the stored form: float32 (n, d), int8 (n, d) or packed bits uint8
    (n, d / 8)."""
    if storage not in STORAGES:
        raise ValueError(f"storage must be one of {STORAGES}, got {storage!r}")
    vectors = np.asarray(vectors, dtype=np.float32)
    if storage == "float32":
        return vectors
    if storage == "binary":
        return np.packbits(vectors > 0, axis=-1)
    if ranges is None:
        raise ValueError("int8 storage needs the calibration ranges (int8_ranges)")
    starts = ranges[0]
    steps = (ranges[1] - starts) / 255
    steps = np.where(steps == 0, 1, steps)  # a constant dimension: every value in step 0
    levels = np.clip(np.floor((vectors - starts) / steps), 0, 255)
    return (levels - 128).astype(np.int8)


def stored_bytes(storage: str, dimensions: int) -> int:
    """Bytes of one stored vector (the graph's links come on top)."""
    return {"float32": 4 * dimensions, "int8": dimensions, "binary": (dimensions + 7) // 8}[storage]
