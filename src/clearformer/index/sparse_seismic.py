"""Seismic (``pyseismic-lsr``, Bruch et al. 2024), the approximate engine a sparse index may
use for candidates (``SparseOptions(engine="seismic")``).

Seismic keeps, per term, only the documents with the largest weights (``n_postings``),
clusters each posting list into blocks with a summary vector, and at query time skips the
blocks whose summary cannot reach the current top k. It answers in a fraction of the time of
an exact accumulation over long posting lists, at a small loss of recall
(``benchmarks/sparse_index.py`` measures both). Its candidates are rescored here by the exact
dot product with the documents' stored rows, so every score a search returns is exact; only
the candidate set is approximate.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from .ragged import Ragged

FILE = "sparse.index.seismic"  # Seismic's own serialisation (``SeismicIndex.save``)


def seismic_module():
    try:
        import seismic
    except ImportError:
        raise ImportError(
            "a sparse index with engine='seismic' needs pyseismic-lsr: pip install pyseismic-lsr"
        ) from None
    return seismic


def write_seismic(folder: Path, rows: Ragged) -> None:
    """Seismic's index of ``rows`` (document ids are row numbers) as ``folder / FILE``."""
    seismic = seismic_module()
    string = seismic.get_seismic_string()
    dataset = seismic.SeismicDataset()
    for i in range(rows.rows):
        terms, values = rows.row(i)
        if len(terms):
            dataset.add_document(
                str(i), terms.astype(str).astype(string), values.astype(np.float32)
            )
    with _engine_output_to_stderr():
        index = seismic.SeismicIndex.build_from_dataset(dataset)
        index.save(str(folder / FILE).removesuffix(".index.seismic"))


@contextlib.contextmanager
def _engine_output_to_stderr():
    """Seismic's Rust code prints its progress to file descriptor 1; a command's standard
    output is its results (``clearformer search --json``), so while it builds, descriptor 1
    points at standard error. A build is one writer in its own process: no other thread's
    output is moved."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def open_seismic(path: Path) -> Any:
    return seismic_module().SeismicIndex.load(str(path))


def seismic_candidates(
    index: Any, terms: np.ndarray, weights: np.ndarray, count: int, query_cut: int, heap: float
) -> np.ndarray:
    """(c,) int64 rows of Seismic's approximate top ``count`` for one query."""
    if not len(terms):
        return np.zeros(0, dtype=np.int64)
    string = seismic_module().get_seismic_string()
    found = index.search(
        "q",
        terms.astype(str).astype(string),
        np.asarray(weights, dtype=np.float32),
        count,
        query_cut,
        heap,
    )
    return np.array([int(document) for _, _, document in found], dtype=np.int64)
