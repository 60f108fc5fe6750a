"""``CrossEncoder.predict`` with its default two workers against one at a time, and against
``sentence_transformers.CrossEncoder.predict``, on a MiniLM-size BERT cross-encoder.

No reranker checkpoint ships on PyPI, so the benchmark builds one: a
``BertForSequenceClassification`` with the bundled all-MiniLM-L6-v2's shape and tokenizer and
random weights (one label), saved to a scratch directory. Speed does not depend on the values
of the weights. The pairs are queries from the ``sentences`` corpus of ``encode_throughput.py``
and passages from its ``--passages`` corpus (``mixed`` by default: sentences with a tail of
paragraphs; ``sentences``: short pairs), both libraries truncating at the tokenizer's 512
pieces.

The three configurations take turns, ``--rounds`` times, each call scoring every pair; each
figure is the configuration's best round. The scores of the two clearformer rows are compared
with each other and with sentence-transformers'. The load average before and after is recorded.

Run: ``python benchmarks/rerank_workers.py [--pairs 600] [--rounds 4] [--passages mixed]`` on a
quiet machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.txt",
    "tokenizer_config.json",
    "special_tokens_map.json",
)


def build_checkpoint(directory: Path) -> None:
    """A random MiniLM-size BERT cross-encoder with the bundled tokenizer, in ``directory``."""
    import torch
    import transformers

    from clearformer.interop.hf import bundled_model_dir

    source = bundled_model_dir()
    config = transformers.BertConfig.from_pretrained(str(source), num_labels=1)
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(config).eval()
    model.save_pretrained(str(directory))
    for name in TOKENIZER_FILES:
        if (source / name).exists():
            shutil.copy(source / name, directory / name)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--pairs",
        type=int,
        default=600,
        help="(query, passage) pairs scored per call (default %(default)s)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=4,
        help="rounds; each figure is the best round (default %(default)s)",
    )
    parser.add_argument(
        "--passages",
        choices=("mixed", "sentences"),
        default="mixed",
        help="corpus of the passages: texts up to paragraphs, or sentences (default %(default)s)",
    )
    args = parser.parse_args()

    from clearformer.bench.load import LoadMeter

    meter = LoadMeter(threads=os.cpu_count() or 1).start()
    from clearformer.runtime import retain_freed_memory

    retain_freed_memory()
    import numpy as np
    import sentence_transformers
    import torch

    from clearformer import CrossEncoder
    from clearformer.text.encoder import attention_kernel_for
    from encode_throughput import make_corpus

    # As a large predict call would: build the AVX-512 kernels where they can be, and measure
    # them where this CPU has no verdict yet (auto takes each only where it measured faster).
    attention_kernel_for(10**9, torch.device("cpu"))
    queries = make_corpus(args.pairs, "sentences", seed=2)
    passages = make_corpus(args.pairs, args.passages, seed=3)
    pairs = list(zip(queries, passages, strict=True))
    with tempfile.TemporaryDirectory() as scratch:
        build_checkpoint(Path(scratch))
        ours = CrossEncoder.from_pretrained(scratch)
        theirs = sentence_transformers.CrossEncoder(scratch, device="cpu")
        runners = {
            "sentence-transformers": lambda: theirs.predict(pairs, batch_size=32),
            "clearformer workers 1": lambda: ours.predict(pairs, workers=1),
            "clearformer": lambda: ours.predict(pairs),
        }
        for run in runners.values():
            run()  # lazy initialisation, the weight reordering, the kernel's first call
        best = dict.fromkeys(runners, float("inf"))
        scores = {}
        for round_ in range(args.rounds):
            names = list(runners)
            names = names[round_ % len(names) :] + names[: round_ % len(names)]
            for name in names:
                start = time.perf_counter()
                scores[name] = np.asarray(runners[name]())
                best[name] = min(best[name], time.perf_counter() - start)
    verdict = meter.record()
    reference = best["sentence-transformers"]
    print(
        f"{args.pairs} pairs ({args.passages} passages), best of {args.rounds} rounds, "
        f"torch {torch.__version__}"
    )
    for name, seconds in best.items():
        print(
            f"{name:>24}: {args.pairs / seconds:7.1f} pairs/s  {reference / seconds:.2f}x "
            f"sentence-transformers; largest score difference to it "
            f"{np.abs(scores[name] - scores['sentence-transformers']).max():.1e}"
        )
    print(f"two workers against one: {best['clearformer workers 1'] / best['clearformer']:.3f}x")
    print(verdict.describe())


if __name__ == "__main__":
    main()
