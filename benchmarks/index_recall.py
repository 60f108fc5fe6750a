"""Recall@10 and size of clearformer's vector index on real embeddings, per storage.

For each storage (float32, int8, binary) and search (HNSW graph, exact scan), the index is
built over the embeddings less the held-out queries, and its top 10 is compared with the
float32 exact top 10 (numpy). Also the memory and disk per vector, the build time and the
median time of one query. The embeddings default to 100,000 BBC News spans
(``benchmarks/index_corpus.py``) encoded by the bundled all-MiniLM-L6-v2.

    python benchmarks/index_corpus.py --out bbc-spans.txt --limit 100000
    python benchmarks/index_recall.py --embeddings bbc-spans.npy --texts bbc-spans.txt \\
        --out benchmarks/results/index-recall.md
"""

from __future__ import annotations

import argparse
import functools
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
    load_record,
    machine,
    per_query_ms,
    recall,
    start_load,
    write_report,
)

K = 10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--embeddings", type=Path, required=True, help=".npy of unit rows")
    parser.add_argument("--texts", type=Path, help="texts to encode if --embeddings is missing")
    parser.add_argument("--queries", type=int, default=500, help="held-out query rows (500)")
    parser.add_argument(
        "--storages",
        default="float32,int8,binary",
        help="comma-separated storages of the index to measure (default %(default)s)",
    )
    parser.add_argument(
        "--ann",
        default="hnsw,exact",
        help="comma-separated searches to measure: hnsw (the graph), exact (a full scan of the "
        "index) (default %(default)s)",
    )
    parser.add_argument(
        "--expansion-search",
        type=int,
        default=None,
        help="the graph's candidate list while searching (HNSW ef; default: the index's, 128)",
    )
    parser.add_argument("--out", type=Path, help="write the result as Markdown (and .json)")
    args = parser.parse_args()

    vectors = embeddings(args.embeddings, args.texts)
    rng = np.random.default_rng(0)
    held = np.zeros(len(vectors), dtype=bool)
    held[rng.choice(len(vectors), args.queries, replace=False)] = True
    corpus, queries = vectors[~held], vectors[held]
    truth = exact_top(corpus, queries, K)
    meter = start_load(2)
    encoder = RowEncoder(corpus)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for storage in args.storages.split(","):
            for ann in args.ann.split(","):
                search = {}
                if args.expansion_search:
                    search["expansion_search"] = args.expansion_search
                options = IndexOptions(storage=storage, ann=ann, chunk_rows=100_000, **search)
                started = time.perf_counter()
                index = build_index(
                    Path(scratch) / f"{storage}-{ann}",
                    encoder.texts(range(len(corpus))),
                    encoder,
                    options=options,
                )
                built = time.perf_counter() - started
                found, _ = index.search_vectors(queries, k=K)
                median, p95 = per_query_ms(functools.partial(index.search_vectors, k=K), queries)
                stats = index.stats()
                row = {
                    "storage": storage,
                    "search": ann,
                    "rows": len(corpus),
                    "recall@10": round(recall(found, truth), 4),
                    "rescored candidates": K * options.rescore,
                    "memory B/vector": round(stats.memory_per_vector, 1),
                    "disk B/vector": round(stats.disk_per_vector, 1),
                    "build s": round(built, 1),
                    "query ms (median)": round(median, 3),
                    "query ms (p95)": round(p95, 3),
                }
                print(json.dumps(row))
                rows.append(row)
    report(args, rows, machine(threads=os.cpu_count() or 1), load_record(meter))


def report(args, rows, host, load) -> None:
    intro = [
        "# Index recall@10 against float32 exact search",
        "",
        f"Embeddings: {args.embeddings.name}, {rows[0]['rows']:,} rows + {args.queries} "
        "held-out queries. Graph: usearch HNSW, connectivity 16, expansion 128 (add) / "
        f"{args.expansion_search or 128} (search).",
    ]
    record = {"rows": rows, "machine": host, "load": load}
    write_report(intro, rows, host, load, args.out, record)


if __name__ == "__main__":
    main()
