"""``CrossEncoder.predict`` in each precision (float32, bf16, int8-blocks) on a MiniLM-size BERT
cross-encoder: pairs/s and each one's largest score difference to float32.

The checkpoint and the pairs are ``rerank_workers.py``'s (the bundled all-MiniLM-L6-v2's shape
and tokenizer, random weights, one label; its queries and passages). The precisions take turns,
``--rounds`` times, each call scoring every pair; each figure is the precision's best round.
Scores are compared before the sigmoid (``activation="identity"``), where a difference is not
squeezed.

Run: ``python benchmarks/rerank_precisions.py [--pairs 600] [--rounds 3]
[--out benchmarks/results/rerank-precisions]`` on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from clearformer.io import write_text_atomically

sys.path.insert(0, str(Path(__file__).resolve().parent))

PRECISIONS = ("float32", "bf16", "int8-blocks")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--passages", default="mixed", choices=("mixed", "sentences"))
    parser.add_argument("--out", type=Path, default=None, help="write OUT.md")
    args = parser.parse_args(argv)

    from clearformer import CrossEncoder
    from clearformer.bench.load import LoadMeter
    from clearformer.cpu import cpu_description
    from encode_throughput import make_corpus
    from rerank_workers import build_checkpoint

    meter = LoadMeter(threads=os.cpu_count() or 1).start()
    with tempfile.TemporaryDirectory() as scratch:
        build_checkpoint(Path(scratch))
        queries = make_corpus(args.pairs, "sentences", seed=2)  # as rerank_workers.py's
        passages = make_corpus(args.pairs, args.passages, seed=3)
        pairs = list(zip(queries, passages, strict=True))
        ranker = CrossEncoder.from_pretrained(scratch)
        for precision in PRECISIONS:  # builds each precision's model, outside the timing
            ranker.predict(pairs[:8], precision=precision)
        best = dict.fromkeys(PRECISIONS, 0.0)
        scores = {}
        for _ in range(args.rounds):
            for precision in PRECISIONS:
                start = time.perf_counter()
                scores[precision] = ranker.predict(
                    pairs, precision=precision, activation="identity"
                )
                best[precision] = max(best[precision], len(pairs) / (time.perf_counter() - start))
    reference = scores["float32"]
    spread = float(np.abs(reference).max())
    lines = [
        "# CrossEncoder.predict by precision: a MiniLM-size BERT cross-encoder",
        "",
        f"{len(pairs)} pairs ({args.passages} passages), best of {args.rounds} rounds. "
        f"{cpu_description()['summary']}.",
        f"Machine: {meter.record().describe()}",
        f"Command: `python benchmarks/rerank_precisions.py --pairs {args.pairs} "
        f"--rounds {args.rounds} --passages {args.passages}`",
        "",
        "| precision | pairs/s | against float32 | largest logit difference / largest logit |",
        "| --- | ---: | ---: | ---: |",
    ]
    for precision in PRECISIONS:
        difference = float(np.abs(scores[precision] - reference).max()) / spread
        lines.append(
            f"| {precision} | {best[precision]:.1f} | {best[precision] / best['float32']:.2f}x "
            f"| {difference:.2e} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        write_text_atomically(args.out.with_suffix(".md"), text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
