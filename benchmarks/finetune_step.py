"""Time one fine-tuning step of the bundled MiniLM classifier, with length-bucketed batches
against plain shuffled ones (same texts, same step code: only the padding differs).

    PYTHONPATH=src python benchmarks/finetune_step.py [--steps 5] [--batch-size 32]

Prints the padding fraction and the median seconds per step of each batching. The texts are
synthetic, lengths uniform in [8, 128] tokens, so the padding is that of a ragged corpus.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--steps", type=int, default=5, help="timed steps of each batching (default %(default)s)"
    )
    parser.add_argument(
        "--batch-size", type=int, default=32, help="texts per step (default %(default)s)"
    )
    parser.add_argument(
        "--examples", type=int, default=1024, help="synthetic texts to batch (default %(default)s)"
    )
    args = parser.parse_args()

    from clearformer.interop.hf import load_model
    from clearformer.train.collate import pad_sequences
    from clearformer.train.models import TextClassifier
    from clearformer.train.precision import Precision
    from clearformer.train.sampler import BucketSampler, padding_fraction, random_batches
    from clearformer.train.step import micro_batches

    torch.manual_seed(0)
    rng = random.Random(0)
    loaded = load_model(None)
    model = TextClassifier(loaded.model, 5, "mean", 0.1).train()
    vocab = loaded.model.config.vocab_size
    sequences = [
        [rng.randrange(1000, vocab) for _ in range(rng.randint(8, 128))]
        for _ in range(args.examples)
    ]
    labels = [rng.randrange(5) for _ in sequences]
    lengths = [len(s) for s in sequences]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    precision = Precision("fp32", torch.device("cpu"))

    class Data:  # the task interface train_step needs: train_batch(indices)
        def train_batch(self, indices):
            return pad_sequences([sequences[i] for i in indices], [labels[i] for i in indices], 0)

    from clearformer.train.step import train_step

    plans = {
        "bucketed": BucketSampler(lengths, args.batch_size, seed=0).epoch_batches(),
        "shuffled": random_batches(len(lengths), args.batch_size, 0),
    }
    print(f"MiniLM classifier, batch {args.batch_size}, {torch.get_num_threads()} threads")
    for name, batches in plans.items():
        times = []
        for batch in batches[: args.steps + 1]:
            assert micro_batches(batch, 1) == [batch]
            start = time.perf_counter()
            train_step(
                model,
                Data(),
                batch,
                accumulation=1,
                optimizer=optimizer,
                precision=precision,
                scaler=None,
                clip_norm=1.0,
                device=torch.device("cpu"),
            )
            times.append(time.perf_counter() - start)
        pad = padding_fraction(batches, lengths)
        print(f"{name:>9}: padding {pad:6.1%}, median {statistics.median(times[1:]):.3f} s/step")


if __name__ == "__main__":
    main()
