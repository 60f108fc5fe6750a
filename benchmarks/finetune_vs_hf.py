"""One fine-tuning step of the bundled MiniLM classifier: clearformer on packed batches against
Hugging Face ``BertForSequenceClassification`` on padded batches with a plain loop.

    python benchmarks/finetune_vs_hf.py [--steps 8] [--batch-size 32] [--min-length 16]
        [--max-length 256] [--out benchmarks/results/finetune-vs-hf]

Both start from the same all-MiniLM-L6-v2 weights and see the same batches of the same token
ids (lengths uniform in [--min-length, --max-length]: a ragged corpus), in training mode
(dropout 0.1), fp32, with cross-entropy, backward, gradient clipping at 1.0 and an AdamW step.
clearformer packs each batch (ids (N,) + cu_seqlens: no padding reaches the model); Hugging
Face pads each batch to its longest sequence and passes the attention mask, which is what a
plain loop with ``DataCollatorWithPadding`` does. The two take turns step by step. Reported:
real (unpadded) tokens per second, wall and process CPU time per step (median), the ratio, and
the load average before and after (a run taken under load is flagged).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path

from clearformer.io import write_text_atomically

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from torch import nn  # noqa: E402


def make_batches(vocab: int, args) -> list[list[list[int]]]:
    rng = random.Random(0)
    batches = []
    for _ in range(args.steps + args.warmup):
        batch = []
        for _ in range(args.batch_size):
            n = rng.randint(args.min_length, args.max_length)
            # [CLS] ... [SEP] around random word pieces, as a tokenizer would give
            batch.append([101, *(rng.randrange(1000, vocab) for _ in range(n - 2)), 102])
        batches.append(batch)
    return batches


def clearformer_step(model, optimizer, batch, labels) -> None:
    from clearformer.train.collate import pack_sequences

    packed = pack_sequences(batch, labels)
    logits = model(packed)  # (B, L)
    loss = nn.functional.cross_entropy(logits, packed.labels)
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def hf_step(model, optimizer, batch, labels) -> None:
    longest = max(len(s) for s in batch)
    ids = torch.zeros(len(batch), longest, dtype=torch.long)  # (B, T), pad id 0
    for row, s in enumerate(batch):
        ids[row, : len(s)] = torch.tensor(s)
    out = model(input_ids=ids, attention_mask=ids != 0, labels=torch.tensor(labels))
    out.loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def build(num_labels: int):
    import transformers

    from clearformer.interop.hf import load_model
    from clearformer.interop.hf.bundled import bundled_model_dir
    from clearformer.train.models import TextClassifier

    transformers.logging.set_verbosity_error()  # the new head's "newly initialized" notice
    torch.manual_seed(0)
    ours = TextClassifier(load_model(None).model, num_labels, "cls", 0.1).train()
    theirs = transformers.BertForSequenceClassification.from_pretrained(
        bundled_model_dir(), num_labels=num_labels
    ).train()
    return ours, theirs


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--steps", type=int, default=8, help="timed steps of each (default %(default)s)"
    )
    parser.add_argument(
        "--warmup", type=int, default=2, help="untimed steps of each first (default %(default)s)"
    )
    parser.add_argument(
        "--batch-size", type=int, default=32, help="sequences per step (default %(default)s)"
    )
    parser.add_argument(
        "--min-length", type=int, default=16, help="shortest sequence, tokens (default %(default)s)"
    )
    parser.add_argument(
        "--max-length", type=int, default=256, help="longest sequence, tokens (default %(default)s)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=torch.get_num_threads(),
        help="torch threads (default: torch's, here %(default)s)",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="write OUT.json and OUT.md (default: print only)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from clearformer.bench.load import LoadMeter

    ours, theirs = build(num_labels=5)
    batches = make_batches(ours.model.config.vocab_size, args)
    rng = random.Random(1)
    labels = [[rng.randrange(5) for _ in b] for b in batches]
    runners = {
        "clearformer (packed)": (
            clearformer_step,
            ours,
            torch.optim.AdamW(ours.parameters(), lr=1e-5),
        ),
        "HF BertForSequenceClassification (padded)": (
            hf_step,
            theirs,
            torch.optim.AdamW(theirs.parameters(), lr=1e-5),
        ),
    }
    wall: dict[str, list[float]] = {name: [] for name in runners}
    cpu: dict[str, list[float]] = {name: [] for name in runners}
    from clearformer import routes
    from clearformer.dropout import counter_masks

    # Dropout's masks as clearformer.train takes them (counter-based where the kernel's
    # verdict says so); Hugging Face's model keeps PyTorch's.
    masks = routes.dropout_masks_route()
    meter = LoadMeter(threads=args.threads).start()
    for index, (batch, label) in enumerate(zip(batches, labels, strict=True)):
        for name, (step, model, optimizer) in runners.items():
            ours_now = name.startswith("clearformer")
            start_wall, start_cpu = time.perf_counter(), time.process_time()
            with counter_masks(ours_now and masks.choice == "counter"):
                step(model, optimizer, batch, label)
            if index >= args.warmup:
                wall[name].append(time.perf_counter() - start_wall)
                cpu[name].append(time.process_time() - start_cpu)
    load = meter.record()

    timed = batches[args.warmup :]
    real = sum(len(s) for b in timed for s in b) / len(timed)
    padded = sum(len(b) * max(len(s) for s in b) for b in timed) / len(timed)
    rows = []
    for name in runners:
        w, c = statistics.median(wall[name]), statistics.median(cpu[name])
        rows.append({"impl": name, "wall_s": w, "cpu_s": c, "tokens_per_s": real / w})
    base = rows[1]
    for row in rows:
        row["ratio"] = row["tokens_per_s"] / base["tokens_per_s"]
        row["cpu_ratio"] = base["cpu_s"] / row["cpu_s"]
    lines = [
        f"Fine-tuning step, all-MiniLM-L6-v2 classifier, batch {args.batch_size}, lengths "
        f"U[{args.min_length}, {args.max_length}], {args.threads} threads, fp32, dropout 0.1",
        f"Real tokens per step {real:.0f}; the padded batch holds {padded:.0f} "
        f"(padding {1 - real / padded:.1%}). clearformer's dropout masks: {masks.choice} "
        f"({masks.reason}). Machine: {load.describe()}",
        "",
        "| implementation | s/step (wall) | s/step (CPU) | real tokens/s | ratio "
        "| CPU-time ratio |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['impl']} | {r['wall_s']:.3f} | {r['cpu_s']:.3f} | {r['tokens_per_s']:.0f} | "
            f"{r['ratio']:.2f}x | {r['cpu_ratio']:.2f}x |"
        )
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        record = {"args": {k: str(v) for k, v in vars(args).items()}, "load": load.to_dict()}
        record |= {"rows": rows, "real_tokens": real, "padded_tokens": padded}
        write_text_atomically(args.out.with_suffix(".json"), json.dumps(record, indent=2) + "\n")
        write_text_atomically(args.out.with_suffix(".md"), text + "\n")


if __name__ == "__main__":
    main()
