"""Query latency of clearformer's sparse index at 100,000 documents, against a brute-force
sparse product (scipy CSR) and against Seismic (``pyseismic-lsr``, an approximate inverted
index for learned sparse vectors), with recall@10 of each against the exact top 10.

The vectors are synthetic and SPLADE-like: 100-200 non-zeros per document and 20-40 per query,
term ids drawn from a Zipf distribution (s = 1.1) over BERT's 30,522-piece vocabulary, weights
log-normal (positive, a long tail, as SPLADE's log(1 + ReLU) activations). One query at a
time; median and 95th percentile.

* scipy: ``documents @ q`` with the (n, vocab) CSR matrix in memory, then ``argpartition``;
* clearformer: ``SparseIndex.search_vectors``: the query terms' posting lists (memory-mapped),
  accumulated term at a time; exact;
* seismic: ``SeismicIndex.build_from_dataset`` (its defaults) and ``search`` with
  ``query_cut`` and ``heap_factor`` as given;
* clearformer engine=seismic: the same Seismic index inside a clearformer sparse index, its
  100 candidates rescored by the exact dot product.

    python benchmarks/sparse_index.py --rows 100000 --out benchmarks/results/sparse-index.md
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from clearformer.index import SparseOptions, build_index
from clearformer.index.identity import ModelIdentity
from clearformer.index.ragged import Ragged
from index_common import load_record, machine, per_query_ms, recall, start_load, write_report

K = 10
VOCAB = 30_522


def zipf_rows(n: int, low: int, high: int, rng: np.random.Generator, s: float = 1.1) -> Ragged:
    """n sparse rows of ``low``-``high`` distinct Zipf-distributed terms, log-normal weights."""
    cdf = np.cumsum(1.0 / np.arange(1, VOCAB + 1) ** s)
    cdf /= cdf[-1]
    shuffle = rng.permutation(VOCAB)  # the frequent terms anywhere in the vocabulary
    counts = rng.integers(low, high + 1, n)
    indptr, indices = [0], []
    for count in counts:
        terms = np.unique(shuffle[np.searchsorted(cdf, rng.random(count * 3))])
        terms = rng.permutation(terms)[:count]
        indices.append(np.sort(terms))
        indptr.append(indptr[-1] + len(terms))
    indices = np.concatenate(indices).astype(np.int32)
    values = rng.lognormal(0.0, 0.6, len(indices)).astype(np.float32)
    return Ragged(np.array(indptr, np.int64), values, indices)


def as_coo(rows: Ragged, start: int, end: int):
    import torch

    first, last = int(rows.indptr[start]), int(rows.indptr[end])
    owner = np.repeat(np.arange(end - start), np.diff(rows.indptr[start : end + 1]))
    index = torch.from_numpy(np.stack([owner, rows.indices[first:last]]).astype(np.int64))
    values = torch.from_numpy(rows.values[first:last])
    return torch.sparse_coo_tensor(index, values, (end - start, VOCAB)).coalesce()


class RowEncoder:
    """The synthetic documents as a sparse encoder: a text is its row number."""

    kind = "sparse"

    def __init__(self, rows: Ragged) -> None:
        self.rows = rows

    @property
    def identity(self) -> ModelIdentity:
        return ModelIdentity("synthetic", "synthetic", "splade-max", False, VOCAB, 512)

    def encode_document(self, texts, *, batch_size=None, progress=None):
        return as_coo(self.rows, int(texts[0]), int(texts[-1]) + 1)


def csr(rows: Ragged):
    import scipy.sparse

    return scipy.sparse.csr_matrix(
        (rows.values, rows.indices, rows.indptr), shape=(rows.rows, VOCAB)
    )


def first(q) -> int:
    """The query number in a (1, 1) slice from per_query_ms (or a list)."""
    return int(np.asarray(q).ravel()[0])


def top(scores: np.ndarray) -> np.ndarray:
    best = np.argpartition(-scores, K)[:K]
    return best[np.argsort(-scores[best], kind="stable")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000, help="documents (100,000)")
    parser.add_argument("--queries", type=int, default=200, help="queries timed (200)")
    parser.add_argument("--query-cut", type=int, default=20, help="seismic's query_cut (20)")
    parser.add_argument("--heap-factor", type=float, default=0.8, help="seismic's heap_factor")
    parser.add_argument("--no-seismic", action="store_true", help="leave Seismic out")
    parser.add_argument("--out", type=Path, help="write the result as Markdown (and .json)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    documents = zipf_rows(args.rows, 100, 200, rng)
    queries = zipf_rows(args.queries, 20, 40, rng)
    matrix = csr(documents)
    query_matrix = csr(queries)
    exact = (query_matrix @ matrix.T).toarray()  # (Q, n)
    truth = np.stack([top(row) for row in exact])
    meter = start_load(1)
    rows = []

    def brute(i):
        return top(matrix @ query_matrix[i].toarray()[0])

    median, p95 = per_query_ms(lambda q: brute(first(q)), np.arange(args.queries)[:, None])
    found = np.stack([brute(i) for i in range(args.queries)])
    rows.append({"engine": "scipy CSR product", "median ms": f"{median:.2f}",
                 "p95 ms": f"{p95:.2f}", "recall@10": f"{recall(found, truth):.4f}"})  # fmt: skip

    exact = SparseOptions(chunk_rows=max(args.rows // 8, 1))
    rows.append(clearformer_row(documents, queries, truth, args, exact))

    if not args.no_seismic:
        rows.append(seismic_row(documents, queries, truth, args))
        seismic = SparseOptions(chunk_rows=max(args.rows // 8, 1), engine="seismic",
                                query_cut=args.query_cut, heap_factor=args.heap_factor)  # fmt: skip
        rows.append(clearformer_row(documents, queries, truth, args, seismic))
    host = machine(1)
    intro = [
        f"Sparse search, {args.rows:,} synthetic SPLADE-like documents (100-200 non-zeros, "
        f"queries 20-40, Zipf term ids over {VOCAB:,}), one query at a time, "
        f"{args.queries} queries; recall@10 against the exact top 10."
    ]
    record = {"rows": rows, "machine": host, "settings": vars(args) | {"out": str(args.out)}}
    write_report(intro, rows, host, load_record(meter), args.out, record)


def clearformer_row(
    documents: Ragged, queries: Ragged, truth: np.ndarray, args, options: SparseOptions
) -> dict:
    """clearformer's sparse index with ``options``: the exact inverted index, or
    ``engine="seismic"`` (Seismic's candidates, rescored exactly)."""
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        index = build_index(Path(folder) / "idx", [str(i) for i in range(args.rows)],
                            RowEncoder(documents), kind="sparse", options=options)  # fmt: skip
        built = time.perf_counter() - started

        def one(q):
            i = first(q)
            single = Ragged(queries.indptr[i : i + 2] - queries.indptr[i],
                            *(a[queries.indptr[i] : queries.indptr[i + 1]]
                              for a in (queries.values, queries.indices)))  # fmt: skip
            return index.search_vectors(single, K)[0][0]

        median, p95 = per_query_ms(one, np.arange(args.queries)[:, None])
        found = np.stack([one([i]) for i in range(args.queries)])
    engine = (
        f"clearformer exact inverted index (build {built:.1f} s)"
        if options.engine == "exact"
        else f"clearformer engine=seismic, {options.candidates} rescored (build {built:.1f} s)"
    )
    return {"engine": engine, "median ms": f"{median:.2f}", "p95 ms": f"{p95:.2f}",
            "recall@10": f"{recall(found, truth):.4f}"}  # fmt: skip


def seismic_row(documents: Ragged, queries: Ragged, truth: np.ndarray, args) -> dict:
    import seismic

    string = seismic.get_seismic_string()
    dataset = seismic.SeismicDataset()
    for i in range(documents.rows):
        terms, values = documents.row(i)[0], documents.row(i)[1]
        dataset.add_document(str(i), terms.astype(str).astype(string), values)
    started = time.perf_counter()
    engine = seismic.SeismicIndex.build_from_dataset(dataset)
    built = time.perf_counter() - started

    def one(q):
        terms, values = queries.row(first(q))
        found = engine.search("q", terms.astype(str).astype(string), values, K, args.query_cut,
                              args.heap_factor)  # fmt: skip
        return np.array([int(doc) for _, _, doc in found] + [-1] * (K - len(found)))

    median, p95 = per_query_ms(one, np.arange(args.queries)[:, None])
    found = np.stack([one([i]) for i in range(args.queries)])
    return {"engine": f"seismic (build {built:.1f} s; query_cut {args.query_cut}, heap_factor "
            f"{args.heap_factor})", "median ms": f"{median:.2f}", "p95 ms": f"{p95:.2f}",
            "recall@10": f"{recall(found, truth):.4f}"}  # fmt: skip


if __name__ == "__main__":
    main()
