"""Sentence-encoding throughput: clearformer's ``TextEncoder`` against sentence-transformers.

Both encode the same few thousand sentences of mixed length with the bundled all-MiniLM-L6-v2,
in one process, under the same allocator setting (glibc keeps freed memory, see
``clearformer.runtime.retain_freed_memory``), alternating calls so drift hits both alike.
The corpus is synthetic (words of the model's own vocabulary, lengths spread from a few words
to past the 256-piece limit), so nothing is downloaded.

Run: ``python benchmarks/encode_throughput.py [--texts 3000] [--repeats 3] [--batch-size 32]
[--chunk-batches 8]``
"""

from __future__ import annotations

import argparse
import os
import random
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
    parser.add_argument(
        "--chunk-batches",
        type=int,
        default=8,
        help="batches per timed call; 0: the whole corpus in one call per repeat",
    )
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

    def encode_ours(chunk):
        return ours.encode(chunk, batch_size=args.batch_size, normalize=True, progress=False)

    def encode_theirs(chunk):
        return theirs.encode(
            chunk, batch_size=args.batch_size, normalize_embeddings=True, convert_to_numpy=True
        )

    # Warm-up: first calls pay for lazy initialisation in both libraries.
    ours.encode(texts[:64])
    theirs.encode(texts[:64])
    # One `encode` call sorts its texts by length and cuts them into batches: clearformer by
    # token count, sentence-transformers by character count (its `_input_length`). Here each
    # library's order is computed once over the whole corpus, its own way, and cut into chunks
    # of whole batches, so its chunks' batches are those of one call over the whole corpus.
    # Chunk c of both libraries is timed back to back in every repeat and each chunk's best
    # time counts: on a machine shared with other work, a burst of load spoils one chunk's
    # sample instead of a whole run.
    orders = {
        "clearformer": sorted(range(len(texts)), key=lambda i: -lengths[i]),
        "sentence-transformers": [int(i) for i in np.argsort([-len(t) for t in texts])],
    }
    size = args.chunk_batches * args.batch_size if args.chunk_batches > 0 else len(texts)
    chunked = {
        name: [order[i : i + size] for i in range(0, len(texts), size)]
        for name, order in orders.items()
    }
    n_chunks = len(chunked["clearformer"])
    names = ("clearformer", "sentence-transformers")
    runners = {"clearformer": encode_ours, "sentence-transformers": encode_theirs}
    best = {name: [float("inf")] * n_chunks for name in names}
    total = {name: [0.0] * args.repeats for name in names}
    results = {name: np.zeros((len(texts), ours.dim), dtype=np.float32) for name in names}
    for repeat in range(args.repeats):
        for c in range(n_chunks):
            turn = names if (repeat + c) % 2 == 0 else names[::-1]  # alternate who goes first
            for name in turn:
                rows = chunked[name][c]
                chunk = [texts[i] for i in rows]
                start = time.perf_counter()
                vectors = runners[name](chunk)
                elapsed = time.perf_counter() - start
                results[name][rows] = vectors
                best[name][c] = min(best[name][c], elapsed)
                total[name][repeat] += elapsed
    cosine = (results["clearformer"] * results["sentence-transformers"]).sum(1)

    print(
        f"corpus: {len(texts)} texts, sorted by length, in {n_chunks} chunk(s) of up to {size}; "
        f"{tokens} tokens "
        f"(pieces per text: min {min(lengths)}, median {int(np.median(lengths))}, max "
        f"{max(lengths)}; truncated at {ours.max_length})"
    )
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; batch size "
        f"{args.batch_size}; allocator retains freed memory: {retained}; load average at end "
        f"{os.getloadavg()[0]:.2f}"
    )
    print(f"agreement: min cosine {cosine.min():.7f} over {len(texts)} texts")
    seconds = {}
    for name in names:
        seconds[name] = sum(best[name])
        print(
            f"{name:>22}: {len(texts) / seconds[name]:7.1f} texts/s "
            f"({tokens / seconds[name]:8.0f} tokens/s) summing each chunk's best; whole runs "
            f"{', '.join(f'{t:.1f}' for t in total[name])} s"
        )
    ratio = seconds["sentence-transformers"] / seconds["clearformer"]
    print(f"speed-up over sentence-transformers: {ratio:.2f}x")


if __name__ == "__main__":
    main()
