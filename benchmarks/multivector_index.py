"""Multi-vector search latency and recall@10 of clearformer's multi-vector index (MUVERA
candidates in usearch, rescored by exact MaxSim) against exact MaxSim over every document.

The token vectors are synthetic and ColBERT-like: width 128, 30-90 unit vectors per document
drawn near 4 of 256 topic centres, queries of 32 tokens near one document's tokens. One query
at a time; median and 95th percentile; recall@10 against the exact MaxSim top 10, at several
candidate counts (the documents whose MUVERA encodings score highest, rescored by MaxSim).

    python benchmarks/multivector_index.py --rows 20000 \\
        --out benchmarks/results/multivector-index.md
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from clearformer.index import MultiVectorOptions, build_index
from clearformer.index.identity import ModelIdentity
from clearformer.index.ragged import Ragged, token_rows
from index_common import load_record, machine, per_query_ms, recall, start_load, write_report

K = 10
DIM = 128


def synthetic(n: int, queries: int, rng: np.random.Generator) -> tuple[list, list]:
    centres = rng.standard_normal((256, DIM)).astype(np.float32)

    def unit(x):
        return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)

    documents = []
    for _ in range(n):
        count = int(rng.integers(30, 91))
        own = rng.choice(256, 4, replace=False)
        documents.append(
            unit(centres[rng.choice(own, count)] + 0.7 * rng.standard_normal((count, DIM)))
        )
    asked = []
    for _ in range(queries):
        source = documents[int(rng.integers(n))]
        picks = source[rng.choice(len(source), 32)]
        asked.append(unit(picks + 0.5 * rng.standard_normal(picks.shape)))
    return documents, asked


class RowEncoder:
    """The synthetic documents as a multi-vector encoder: a text is its row number."""

    kind = "multivector"

    def __init__(self, documents) -> None:
        self.documents = documents

    @property
    def identity(self) -> ModelIdentity:
        return ModelIdentity("synthetic", "synthetic", "colbert", True, DIM, 512)

    def encode_document(self, texts, *, batch_size=None, progress=None):
        return [self.documents[int(t)] for t in texts]


def first(q) -> int:
    return int(np.asarray(q).ravel()[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000, help="documents (20,000)")
    parser.add_argument("--queries", type=int, default=100, help="queries timed (100)")
    parser.add_argument("--candidates", type=int, nargs="+", default=[100, 200, 500, 1000])
    parser.add_argument(
        "--ann", default="hnsw", choices=("hnsw", "exact"), help="encodings' search"
    )
    parser.add_argument("--out", type=Path, help="write the result as Markdown (and .json)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    documents, queries = synthetic(args.rows, args.queries, rng)
    query_rows = [token_rows([q]) for q in queries]
    meter = start_load(1)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        index = build_index(Path(folder) / "idx", [str(i) for i in range(args.rows)],
                            RowEncoder(documents), kind="multivector",
                            options=MultiVectorOptions(ann=args.ann, chunk_rows=4096))  # fmt: skip
        built = time.perf_counter() - started

        def search(count: int | None):
            def one(q) -> np.ndarray:
                single: Ragged = query_rows[first(q)]
                return index.search_vectors(single, K, exact=count is None, candidates=count)[0][0]

            return one

        exact = search(None)
        truth = np.stack([exact([i]) for i in range(args.queries)])
        median, p95 = per_query_ms(exact, np.arange(args.queries)[:, None])
        rows.append({"search": "exact MaxSim, every document", "median ms": f"{median:.1f}",
                     "p95 ms": f"{p95:.1f}", "recall@10": "1.0000"})  # fmt: skip
        for count in args.candidates:
            one = search(count)
            median, p95 = per_query_ms(one, np.arange(args.queries)[:, None])
            found = np.stack([one([i]) for i in range(args.queries)])
            rows.append({"search": f"MUVERA ({args.ann}) top {count}, MaxSim rescored",
                         "median ms": f"{median:.1f}", "p95 ms": f"{p95:.1f}",
                         "recall@10": f"{recall(found, truth):.4f}"})  # fmt: skip
        encoding = index.muvera.config.dimensions
    host = machine(1)
    intro = [
        f"Multi-vector search, {args.rows:,} synthetic documents of 30-90 tokens of width {DIM}, "
        f"queries of 32 tokens, one query at a time, {args.queries} queries; MUVERA encodings "
        f"of {encoding:,} values (defaults of MultiVectorOptions), index built in {built:.1f} s; "
        "recall@10 against exact MaxSim."
    ]
    record = {"rows": rows, "machine": host, "settings": vars(args) | {"out": str(args.out)}}
    write_report(intro, rows, host, load_record(meter), args.out, record)


if __name__ == "__main__":
    main()
