"""Hard-negative mining: ``clearformer mine``'s code against sentence-transformers'
``mine_hard_negatives``, the same pairs, corpus, model and settings, each in a process of its
own: wall time and peak resident memory.

Texts: BBC News spans (``benchmarks/index_corpus.py``: sentences, runs of sentences,
paragraphs). The pairs are (sentence, the span of it and the next sentence) for the first
``--queries`` sentences that have one; the corpus is the first ``--documents`` spans. Settings
as sentence-transformers names them: ``num_negatives`` 3, ``range_max`` 50, top sampling,
``relative_margin`` 0.05, batch size 128, no faiss (its default), ``output_format="n-tuple"``.
clearformer builds its index in a temporary folder (exact scan below 20,000 rows, HNSW above:
the index's own rule).

Run: ``python benchmarks/mining.py [--queries 10000] [--documents 100000]
[--out benchmarks/results/mining]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from clearformer.io import write_text_atomically

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))


def texts(queries: int, documents: int) -> tuple[list[tuple[str, str]], list[str]]:
    from index_corpus import _SENTENCE_END, articles, spans

    pairs: list[tuple[str, str]] = []
    seen: set[str] = set()
    for _, paragraphs in articles():
        for paragraph in paragraphs:
            sentences = _SENTENCE_END.split(paragraph)
            for a, b in zip(sentences, sentences[1:], strict=False):
                if len(pairs) < queries and len(a) >= 20 and a not in seen:
                    seen.add(a)
                    pairs.append((a, f"{a} {b}"))
    corpus = list(dict.fromkeys([p for _, p in pairs] + spans(documents)))[:documents]
    return pairs, corpus


def run_clearformer(pairs, corpus) -> int:
    from clearformer import TextEncoder
    from clearformer.retrieval.mining import MiningSettings, mine_hard_negatives

    encoder = TextEncoder.from_pretrained()
    with tempfile.TemporaryDirectory() as folder:
        rows, _ = mine_hard_negatives(
            pairs,
            encoder,
            Path(folder) / "idx",
            corpus=corpus,
            settings=MiningSettings(negatives=3, range_max=50, relative_margin=0.05),
            encode_options={"batch_size": 128},
        )
    return sum(len(r["negative"]) for r in rows)


def run_sentence_transformers(pairs, corpus) -> int:
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.util import mine_hard_negatives

    from clearformer.interop.hf.bundled import bundled_model_dir

    model = SentenceTransformer(str(bundled_model_dir()), device="cpu")
    data = Dataset.from_dict({"anchor": [a for a, _ in pairs], "positive": [p for _, p in pairs]})
    mined = mine_hard_negatives(
        data,
        model,
        corpus=corpus,
        num_negatives=3,
        range_max=50,
        relative_margin=0.05,
        sampling_strategy="top",
        batch_size=128,
        output_format="n-tuple",
        verbose=False,
    )
    return sum(1 for row in mined for k, v in row.items() if k.startswith("negative") and v)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queries", type=int, default=10_000)
    parser.add_argument("--documents", type=int, default=100_000)
    parser.add_argument("--out", default=None)
    parser.add_argument("--library", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.library:
        from clearformer.bench.memory import _high_water_bytes

        pairs, corpus = texts(args.queries, args.documents)
        start = time.perf_counter()
        run = run_clearformer if args.library == "clearformer" else run_sentence_transformers
        negatives = run(pairs, corpus)
        print(
            json.dumps(
                {
                    "seconds": time.perf_counter() - start,
                    "negatives": negatives,
                    "queries": len(pairs),
                    "documents": len(corpus),
                    # VmHWM: ru_maxrss would carry the parent's size across fork and exec.
                    "peak_mib": _high_water_bytes() / 2**20,
                }
            )
        )
        return
    results = {"load_before": os.getloadavg()}
    for library in ("sentence-transformers", "clearformer"):
        done = subprocess.run(
            [
                sys.executable,
                __file__,
                "--queries",
                str(args.queries),
                "--documents",
                str(args.documents),
                "--library",
                library,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(done.stderr[-3000:])
        results[library] = json.loads(done.stdout.strip().splitlines()[-1])
        print(library, results[library], flush=True)
    results["time_ratio"] = (
        results["sentence-transformers"]["seconds"] / results["clearformer"]["seconds"]
    )
    if args.out:
        write_text_atomically(Path(args.out + ".json"), json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
