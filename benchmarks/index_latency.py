"""Query latency of clearformer's vector index at 100,000 and 1,000,000 vectors, against a
brute-force numpy scan and against usearch (the same library, on the same graph file) used
directly.

The vectors are real embeddings (default: 100,000 BBC News spans by the bundled
all-MiniLM-L6-v2, ``benchmarks/index_corpus.py``), grown to 1,000,000 with noisy copies
(``index_common.grow``: cosine about 0.9 to their originals). One query at a time, median
and 95th percentile; recall@10 of each against the exact top 10 beside it.

* numpy: ``corpus @ q`` and ``argpartition``, the whole float32 matrix in memory;
* usearch direct: ``Index.restore(path, view=True).search(q, 10)`` on the graph clearformer
  wrote: the engine alone;
* clearformer: ``VectorIndex.search_vectors``: the same graph, plus quantising the query,
  rescoring in float32 from the memory-mapped vectors, ties in row order.

    python benchmarks/index_latency.py --embeddings bbc-spans.npy --rows 100000 1000000 \\
        --out benchmarks/results/index-latency.md
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from clearformer.index import IndexOptions, build_index
from index_common import (
    RowEncoder,
    embeddings,
    exact_top,
    grow,
    load_record,
    machine,
    per_query_ms,
    recall,
    start_load,
    write_report,
)

K = 10


def brute_force(n, corpus, queries, truth) -> dict:
    """numpy's scan, timed before any index is built in this process (``--brute-force-only``
    times it in a process that builds none): on the 2-core machine of docs/index.md a
    100,000-row scan took 105 ms per query after a graph build in the same process and 16 ms
    in a fresh one a minute later; the cause was not pinned down."""

    def brute(q):
        scores = corpus @ q[0]
        top = np.argpartition(-scores, K)[:K]
        return top[np.argsort(-scores[top])]

    median, p95 = per_query_ms(brute, queries)
    row = {
        "vectors": n,
        "search": "numpy brute force",
        "recall@10": 1.0,
        "query ms (median)": round(median, 3),
        "query ms (p95)": round(p95, 3),
        "index build s": "-",
    }
    print(json.dumps(row), flush=True)
    return row


def measure(n, queries, truth, index, built) -> list[dict]:
    """One row per way of searching the index's graph: usearch alone, and clearformer."""
    import usearch.index

    graph_file = index.root / "generations" / index.generation / "hnsw.usearch"
    direct = usearch.index.Index.restore(str(graph_file), view=True)
    direct.expansion_search = index.options.expansion_search
    ways = {
        "usearch direct": (
            lambda q: direct.search(q, K),
            lambda: np.asarray(direct.search(queries, K).keys),
        ),
        "clearformer index": (
            lambda q: index.search_vectors(q, k=K),
            lambda: index.search_vectors(queries, k=K)[0],
        ),
    }
    rows = []
    for name, (one, every) in ways.items():
        median, p95 = per_query_ms(one, queries)
        row = {
            "vectors": n,
            "search": name,
            "recall@10": round(recall(every(), truth), 4),
            "query ms (median)": round(median, 3),
            "query ms (p95)": round(p95, 3),
            "index build s": round(built, 1),
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--embeddings", type=Path, required=True, help=".npy of unit rows")
    parser.add_argument("--texts", type=Path, help="texts to encode if --embeddings is missing")
    parser.add_argument(
        "--rows",
        type=int,
        nargs="+",
        default=[100_000, 1_000_000],
        help="index sizes in vectors; beyond the embeddings' count, noisy copies of them are "
        "added (default 100000 1000000)",
    )
    parser.add_argument("--queries", type=int, default=200, help="queries timed (200)")
    parser.add_argument(
        "--storage",
        default="float32",
        help="the index's storage: float32, int8 or binary (default float32)",
    )
    parser.add_argument(
        "--brute-force-only", action="store_true", help="time the numpy scan alone (no index)"
    )
    parser.add_argument("--out", type=Path, help="write the result as Markdown (and .json)")
    args = parser.parse_args()

    real = embeddings(args.embeddings, args.texts)
    rng = np.random.default_rng(1)
    # Queries: real rows, each with a little noise so that none is its own exact match.
    picked = real[rng.choice(len(real), args.queries, replace=False)]
    noise = rng.standard_normal(picked.shape, dtype=np.float32) * (0.3 / np.sqrt(real.shape[1]))
    queries = picked + noise
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    meter = start_load(2)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for n in args.rows:
            corpus = grow(real, n)
            truth = exact_top(corpus, queries, K)
            rows.append(brute_force(n, corpus, queries, truth))
            if args.brute_force_only:
                continue
            encoder = RowEncoder(corpus)
            started = time.perf_counter()
            index = build_index(
                Path(scratch) / f"n{n}",
                encoder.texts(range(n)),
                encoder,
                options=IndexOptions(storage=args.storage, ann="hnsw", chunk_rows=250_000),
            )
            built = time.perf_counter() - started
            rows += measure(n, queries, truth, index, built)
    host = machine(threads=os.cpu_count() or 1)
    intro = [
        "# Index query latency, one query at a time (k = 10)",
        "",
        f"Storage {args.storage}; usearch HNSW, connectivity 16, expansion 128 (add and "
        f"search); {args.queries} queries; vectors grown from {args.embeddings.name}.",
    ]
    record = {"rows": rows, "machine": host}
    write_report(intro, rows, host, load_record(meter), args.out, record)


if __name__ == "__main__":
    main()
