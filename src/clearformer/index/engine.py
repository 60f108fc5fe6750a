"""The vector engine: usearch's HNSW graph, and exact scans, behind a few functions.

usearch (https://github.com/unum-cloud/usearch) was chosen over FAISS for three reasons: its
HNSW graph holds float32, int8 and packed binary vectors natively, with cosine, inner-product
and Hamming metrics, where FAISS needs a different index class per kind (``IndexHNSWFlat``,
``IndexHNSWSQ`` with its own trained quantizer, ``IndexBinaryHNSW``); a saved index is one file
that a reader memory-maps (``view``) instead of loading; and its keys are the integers given at
insertion, so no id map is kept beside the graph. With the same graph settings both gave the
same recall on the vectors they were compared on (docs/index.md).

Keys are the vectors' global row numbers in the index, so a key needs no lookup table.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

# Per storage: usearch's scalar kind and the metric the candidates are chosen by. int8 rows
# carry sentence-transformers' per-dimension offset, so their cosine, not their inner product,
# follows the float32 order best (99.95 % against 99.5 % of the float32 top 10 among the first
# 40 candidates on BBC News paragraphs).
KINDS = {"float32": ("f32", "ip"), "int8": ("i8", "cos"), "binary": ("b1", "hamming")}


class MissingEngineError(ImportError):
    """usearch is not installed."""


def usearch_index_module():
    try:
        import usearch.index
    except ImportError:
        raise MissingEngineError(
            "a vector index needs usearch: pip install 'clearformer[index]' (or pip install "
            "usearch)"
        ) from None
    return usearch.index


def new_graph(storage: str, dimensions: int, options) -> Any:
    """An empty HNSW graph for ``dimensions``-wide vectors of ``storage``."""
    usearch = usearch_index_module()
    dtype, metric = KINDS[storage]
    return usearch.Index(
        ndim=dimensions,
        metric=metric,
        dtype=dtype,
        connectivity=options.connectivity,
        expansion_add=options.expansion_add,
        expansion_search=options.expansion_search,
    )


def add_to_graph(
    graph: Any,
    first_key: int,
    stored: np.ndarray,
    threads: int = 0,
    progress: Callable[[int, int], Any] | None = None,
) -> None:
    """Insert ``stored`` (n, ...) under keys ``first_key .. first_key + n - 1``; ``progress``
    is called with (vectors inserted, n) as they go in (from usearch's threads)."""
    if len(stored):
        keys = np.arange(first_key, first_key + len(stored), dtype=np.uint64)
        graph.add(keys, stored, threads=threads, progress=_usearch_callback(progress))


def _usearch_callback(progress: Callable[[int, int], Any] | None):
    """``progress`` as usearch takes a callback: it checks the annotations, (int, int) ->
    bool, and a True return goes on."""
    if progress is None:
        return None

    def report(done, total):
        progress(int(done), int(total))
        return True

    # The real types, not this module's postponed (string) annotations.
    report.__annotations__ = {"done": int, "total": int, "return": bool}
    return report


def save_graph(graph: Any, path: Path) -> None:
    graph.save(str(path))


def graph_header(path: Path) -> dict[str, Any]:
    """What a saved graph's header says: ``count_present`` (vectors), ``dimensions``,
    ``kind_scalar``, ``kind_metric``; read without mapping the graph."""
    header = usearch_index_module().Index.metadata(str(path))
    if header is None:
        raise FileNotFoundError(f"{path} does not exist")
    return header


def open_graph(path: Path, view: bool = True) -> Any:
    """A saved graph: memory-mapped (``view``, for readers) or loaded (to add to it)."""
    usearch = usearch_index_module()
    graph = usearch.Index.restore(str(path), view=view)
    if graph is None:
        raise ValueError(f"{path} is not a usearch index file")
    return graph


def search_graph(
    graph: Any, queries: np.ndarray, count: int, expansion: int, exact: bool = False
) -> np.ndarray:
    """(Q, count) int64 keys of the approximate nearest stored vectors, -1 where fewer; with
    ``exact``, of the nearest ones by a scan of the graph's own vectors."""
    if exact:
        return _keys(graph.search(queries, count, exact=True), len(queries), count)
    graph.expansion_search = max(expansion, count)
    matches = graph.search(queries, count)
    return _keys(matches, len(queries), count)


def graph_scans(count: int, rows: int, connectivity: int) -> bool:
    """Whether a search for ``count`` candidates among ``rows`` should scan instead of walking
    the graph.

    A walk with a candidate list of ``count`` expands at least ``count`` nodes of the base
    layer and computes the distance to each one's unvisited neighbours, up to
    ``2 * connectivity`` of them: from ``count * 2 * connectivity >= rows`` on it computes
    about as many distances as a scan of every row, in random order rather than in a row, and
    it can still miss rows (a node no path leads to is never found: 293-299 of 300 came back
    for ``k = 300`` on some builds). So from there a scan of the same vectors answers: exact,
    for no more distances computed. Below it, the walk is the point of the graph: at 100,000
    rows and connectivity 16 it walks for up to 3,124 candidates (k up to 390 in int8).
    """
    return count * 2 * connectivity >= rows


def scan(stored: np.ndarray, queries: np.ndarray, count: int, storage: str) -> np.ndarray:
    """(Q, count) int64 row numbers of the nearest stored rows by an exhaustive scan."""
    count = min(count, len(stored))
    if storage == "float32":
        scores = queries @ stored.T  # (Q, n) inner products of unit rows = cosines
        # Stable on -score: equal scores keep row order, as `search --corpus` does.
        return np.argsort(-scores, axis=1, kind="stable")[:, :count].astype(np.int64)
    usearch = usearch_index_module()
    _, metric = KINDS[storage]
    matches = usearch.search(stored, queries, count, metric, exact=True)
    return _keys(matches, len(queries), count)


def _keys(matches: Any, rows: int, count: int) -> np.ndarray:
    """usearch's matches as (rows, count) int64 keys, -1 past each query's found ones (one
    query comes back as ``Matches`` holding only the found keys, several as ``BatchMatches``)."""
    out = np.full((rows, count), -1, dtype=np.int64)
    if hasattr(matches, "counts"):
        keys = np.asarray(matches.keys).astype(np.int64).reshape(rows, -1)
        for i, found in enumerate(np.asarray(matches.counts).reshape(rows)):
            found = min(int(found), count)
            out[i, :found] = keys[i, :found]
    else:
        keys = np.asarray(matches.keys).astype(np.int64)[:count]
        out[0, : len(keys)] = keys
    return out
