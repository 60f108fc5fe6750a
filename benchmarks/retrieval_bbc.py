"""Retrieval quality on the BBC News headline -> article benchmark (``clearformer dataset bbc``).

Rows, each scored by ``clearformer eval``'s metrics (trec_eval's definitions):

* ``bm25``: ``bm25s`` (Lucene's BM25, k1 1.5, b 0.75, English stop words) over the same
  document texts, the lexical baseline;
* ``clearformer float32 exact``, and each ``--variant`` asked: ``bf16``, ``int8`` (encoding
  precision), ``index-int8``, ``index-binary`` (a persistent index with that storage, exact scan,
  rescored in float32), ``dims-128`` (Matryoshka truncation; MiniLM was not trained for it, so
  this shows the cost of cutting a model that was not);
* ``sentence-transformers``: its ``InformationRetrievalEvaluator`` on the same queries, corpus
  and relevance, with the same model: its NDCG@10 beside clearformer's float32 one (they must
  agree within 1e-4).

Run: ``python benchmarks/retrieval_bbc.py [--data DIR] [--split test] [--model DIR]
[--variant bf16 int8 index-int8 index-binary dims-128] [--out benchmarks/results/retrieval-bbc]``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from clearformer.io import write_text_atomically

os.environ.setdefault("HF_HUB_OFFLINE", "1")

VARIANTS = {
    "bf16": {"precision": "bf16"},
    "int8": {"precision": "int8"},
    "index-int8": {"index": True, "storage": "int8", "ann": "exact"},
    "index-binary": {"index": True, "storage": "binary", "ann": "exact"},
    "dims-128": {"dimensions": 128},
}


def bm25_run(data, depth: int) -> dict:
    import bm25s
    import numpy as np

    retriever = bm25s.BM25(k1=1.5, b=0.75)
    retriever.index(
        bm25s.tokenize(data.corpus_texts, stopwords="en", show_progress=False), show_progress=False
    )
    queries = bm25s.tokenize(data.query_texts, stopwords="en", show_progress=False)
    rows, scores = retriever.retrieve(
        queries, k=min(depth, len(data.corpus_ids)), show_progress=False
    )
    return {
        query: {data.corpus_ids[int(r)]: float(s) for r, s in zip(row, score, strict=True)}
        for query, row, score in zip(
            data.query_ids, np.asarray(rows), np.asarray(scores), strict=True
        )
    }


def sentence_transformers_ndcg(data, model_dir: str | None) -> float:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.evaluation import InformationRetrievalEvaluator

    from clearformer.interop.hf.bundled import bundled_model_dir

    model = SentenceTransformer(str(model_dir or bundled_model_dir()), device="cpu")
    evaluator = InformationRetrievalEvaluator(
        queries=dict(zip(data.query_ids, data.query_texts, strict=True)),
        corpus=dict(zip(data.corpus_ids, data.corpus_texts, strict=True)),
        relevant_docs={
            q: {d for d, level in judged.items() if level >= 1} for q, judged in data.qrels.items()
        },
        ndcg_at_k=[10],
        mrr_at_k=[10],
        accuracy_at_k=[1],
        precision_recall_at_k=[10],
        map_at_k=[100],
        show_progress_bar=False,
        name="bbc",
    )
    scores = evaluator(model)
    return float(scores["bbc_cosine_ndcg@10"])


def main() -> None:
    from clearformer import TextEncoder
    from clearformer.retrieval import EvalSettings, evaluate, evaluate_run, load_beir, mean_measures
    from clearformer.retrieval.bbc import write_bbc_benchmark

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=None, help="a BEIR folder (default: BBC, written now)")
    parser.add_argument("--split", default="test")
    parser.add_argument("--model", default=None)
    parser.add_argument("--variant", nargs="*", default=[], choices=sorted(VARIANTS))
    parser.add_argument("--no-st", action="store_true", help="skip sentence-transformers' row")
    parser.add_argument("--out", default=None, help="write OUT.json and OUT.md")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="retrieval-bbc-"))
    folder = args.data
    if folder is None:
        folder = scratch / "bbc"
        write_bbc_benchmark(folder)
    data = load_beir(folder, args.split)
    rows = []
    start = time.perf_counter()
    bm25 = mean_measures(evaluate_run(bm25_run(data, 100), data.qrels))
    rows.append(
        {"row": "bm25 (bm25s)", "metrics": bm25, "seconds": round(time.perf_counter() - start, 2)}
    )
    encoder = TextEncoder.from_pretrained(args.model)
    for name in ["float32", *args.variant]:
        options = dict(VARIANTS.get(name, {}))
        if options.pop("index", False):
            options["index"] = str(scratch / f"{name}.idx")
        result = evaluate(data, encoder, EvalSettings(**options))
        rows.append(
            {
                "row": f"clearformer {name}",
                "metrics": result.metrics,
                "seconds": sum(result.seconds.values()),
            }
        )
        print(rows[-1], flush=True)
    st_ndcg = None if args.no_st else sentence_transformers_ndcg(data, args.model)
    report = {
        "data": data.describe(),
        "model": rows[1:] and result.model,
        "rows": rows,
        "sentence_transformers_ndcg@10": st_ndcg,
        "clearformer_minus_st_ndcg@10": None
        if st_ndcg is None
        else rows[1]["metrics"]["ndcg@10"] - st_ndcg,
    }
    print(json.dumps({k: v for k, v in report.items() if k != "rows"}, indent=1))
    if args.out:
        write_text_atomically(Path(args.out + ".json"), json.dumps(report, indent=1) + "\n")
        write_text_atomically(Path(args.out + ".md"), markdown(report) + "\n")


def markdown(report: dict) -> str:
    names = list(report["rows"][0]["metrics"])
    lines = [
        f"BBC News headline -> article, split {report['data']['split']}: "
        f"{report['data']['queries']} queries, {report['data']['documents']} documents.",
        "",
        "| row | " + " | ".join(names) + " |",
        "| --- | " + " | ".join("---:" for _ in names) + " |",
    ]
    for row in report["rows"]:
        values = " | ".join(f"{row['metrics'][n]:.4f}" for n in names)
        lines.append(f"| {row['row']} | {values} |")
    if report["sentence_transformers_ndcg@10"] is not None:
        lines += [
            "",
            f"sentence-transformers InformationRetrievalEvaluator NDCG@10: "
            f"{report['sentence_transformers_ndcg@10']:.6f} (clearformer float32 minus it: "
            f"{report['clearformer_minus_st_ndcg@10']:+.2e})",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
