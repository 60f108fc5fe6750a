"""Sentence-encoding throughput: clearformer's ``TextEncoder`` against sentence-transformers.

Both encode the same few thousand sentences of mixed length with the bundled all-MiniLM-L6-v2,
in one process, under the same allocator setting (glibc keeps freed memory, see
``clearformer.runtime.retain_freed_memory``), alternating runs so drift hits both alike.
The corpus is synthetic (words of the model's own vocabulary, lengths spread from a few words
to past the 256-piece limit), so nothing is downloaded.

Run: ``python benchmarks/encode_throughput.py [--texts 3000] [--repeats 3] [--batch-size 32]``
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")


def make_corpus(n: int, seed: int = 0) -> list[str]:
    """``n`` sentences; word counts log-uniform in [3, 300] (most short, a long tail)."""
    from clearformer.pretrained import bundled_model_dir

    vocab = (bundled_model_dir() / "vocab.txt").read_text(encoding="utf-8").split("\n")
    words = [w for w in vocab[2000:] if w.isalpha() and w.isascii()]
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        count = int(round(3 * (100 ** rng.random())))  # 3 .. 300 words, log-uniform
        sentence = " ".join(rng.choice(words) for _ in range(count))
        texts.append(sentence.capitalize() + ".")
    return texts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()

    from clearformer.runtime import retain_freed_memory

    retained = retain_freed_memory()  # before any large allocation, for both libraries alike

    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    from clearformer import TextEncoder
    from clearformer.pretrained import bundled_model_dir

    texts = make_corpus(args.texts)
    ours = TextEncoder.from_pretrained()
    theirs = SentenceTransformer(str(bundled_model_dir()), device="cpu")
    lengths = [len(b) for b in ours.tokenize(texts).tokens]
    tokens = sum(lengths)

    def run_ours():
        return ours.encode(texts, batch_size=args.batch_size, normalize=True, progress=False)

    def run_theirs():
        return theirs.encode(
            texts, batch_size=args.batch_size, normalize_embeddings=True, convert_to_numpy=True
        )

    # Warm-up: first calls pay for lazy initialisation in both libraries.
    ours.encode(texts[:64])
    theirs.encode(texts[:64])
    times: dict[str, list[float]] = {"clearformer": [], "sentence-transformers": []}
    results = {}
    for _ in range(args.repeats):
        for name, fn in (("clearformer", run_ours), ("sentence-transformers", run_theirs)):
            start = time.perf_counter()
            results[name] = fn()
            times[name].append(time.perf_counter() - start)
    cosine = (results["clearformer"] * results["sentence-transformers"]).sum(1)

    print(
        f"corpus: {len(texts)} texts, {tokens} tokens (pieces per text: min {min(lengths)}, "
        f"median {int(np.median(lengths))}, max {max(lengths)}; truncated at {ours.max_length})"
    )
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; batch size "
        f"{args.batch_size}; allocator retains freed memory: {retained}"
    )
    print(f"agreement: min cosine {cosine.min():.7f} over {len(texts)} texts")
    best = {}
    for name, values in times.items():
        best[name] = min(values)
        print(
            f"{name:>22}: best {len(texts) / min(values):7.1f} texts/s "
            f"({tokens / min(values):8.0f} tokens/s), median "
            f"{len(texts) / statistics.median(values):7.1f} texts/s"
        )
    ratio = best["sentence-transformers"] / best["clearformer"]
    median_ratio = statistics.median(times["sentence-transformers"]) / statistics.median(
        times["clearformer"]
    )
    print(f"speed-up: {ratio:.2f}x (best), {median_ratio:.2f}x (median)")


if __name__ == "__main__":
    main()
