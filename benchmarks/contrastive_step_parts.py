"""What each part of clearformer's training route gives a contrastive step: A/B runs of one step
of the bundled MiniLM, each setting in a process of its own, alternated.

The step: 32 anchors of 10-24 tokens and 64 documents of 128 (random ids, seed 0), packed,
forward through ``SentenceEmbedder``, in-batch-negatives loss, backward, AdamW; float32 or
bf16 autocast. Settings:

* ``base``: clearformer's route as ``auto`` takes it (run ``clearformer calibrate`` first);
* ``dropout-off``: ``CLEARFORMER_AVX512_DROPOUT=off`` (PyTorch's dropout, SDPA's math path);
* ``one-group``: attention pads every sequence to the batch's longest (``length_groups``
  returns one group), as before grouping by length;
* ``memory-kept``: glibc's malloc keeps freed memory (``clearformer.runtime.
  retain_freed_memory``, which every ``clearformer`` command calls at its start, ``train``
  included): a step's large temporaries reuse pages instead of faulting in fresh ones.

``--profile`` prints ``torch.profiler``'s table of the base step instead, and ``--products``
the rate (GFLOP/s) of ``torch.nn.functional.linear`` alone at a feed-forward product's shape in
float32 and bfloat16: what no step that runs the same products can exceed.

Run: ``python benchmarks/contrastive_step_parts.py [--precision fp32|bf16] [--rounds 2]
[--steps 4] [--profile] [--products]`` on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time

SETTINGS = ("base", "dropout-off", "one-group", "memory-kept")


def child(setting: str, precision: str, steps: int, profile: bool) -> None:
    import torch

    from clearformer import routes
    from clearformer.dropout import counter_masks
    from clearformer.fast import varlen
    from clearformer.text.encoder_files import read_encoder_parts
    from clearformer.train.collate import pack_sequences
    from clearformer.train.contrastive_loss import multiple_negatives_loss
    from clearformer.train.models import SentenceEmbedder
    from clearformer.train.step import build_optimizer

    if setting == "one-group":
        varlen.length_groups = lambda lengths: [list(range(len(lengths)))]
    if setting == "memory-kept":
        from clearformer.runtime import retain_freed_memory

        retain_freed_memory()
    torch.manual_seed(0)
    draw = random.Random(0)
    parts = read_encoder_parts(
        None, backend="auto", strict=True, padding_side=None, truncate_dim=None
    )
    model = SentenceEmbedder(parts.loaded.model, parts.head).train()
    texts = [[draw.randrange(1000, 20000) for _ in range(draw.randint(10, 24))] for _ in range(32)]
    texts += [[draw.randrange(1000, 20000) for _ in range(128)] for _ in range(64)]
    tokens = sum(map(len, texts))
    batch = pack_sequences(texts, [0] * len(texts))
    config = argparse.Namespace(lr=1e-5, weight_decay=0.01, beta1=0.9, beta2=0.999, eps=1e-8)
    optimizer = build_optimizer(model, config)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            embeddings = model(batch).float()
        loss = multiple_negatives_loss(embeddings[:32], embeddings[32:], scale=20.0)
        loss.backward()
        optimizer.step()

    # The masks' generator as clearformer.train decides it for a run.
    with counter_masks(routes.dropout_masks_route().choice == "counter"):
        for _ in range(2):
            step()
        if profile:
            from torch.profiler import ProfilerActivity
            from torch.profiler import profile as run_profile

            with run_profile(activities=[ProfilerActivity.CPU]) as recorded:
                step()
            print(recorded.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
            return
        started = time.perf_counter()
        for _ in range(steps):
            step()
        seconds = (time.perf_counter() - started) / steps
    rate = tokens / seconds
    print(json.dumps({"setting": setting, "seconds": seconds, "tokens_per_second": rate}))


def products() -> None:
    """GFLOP/s of F.linear (2,560 rows, 768 -> 3,072), float32 and bfloat16, median of 5."""
    import statistics

    import torch
    import torch.nn.functional as F

    rows, inputs, outputs = 2560, 768, 3072
    for dtype in (torch.float32, torch.bfloat16):
        x, w = torch.randn(rows, inputs, dtype=dtype), torch.randn(outputs, inputs, dtype=dtype)
        F.linear(x, w)
        seconds = []
        for _ in range(5):
            started = time.perf_counter()
            F.linear(x, w)
            seconds.append(time.perf_counter() - started)
        rate = 2 * rows * inputs * outputs / statistics.median(seconds) / 1e9
        print(f"F.linear {rows} x {inputs} -> {outputs}, {dtype}: {rate:.0f} GFLOP/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="bf16")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--products", action="store_true")
    parser.add_argument("--setting", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.setting:
        child(args.setting, args.precision, args.steps, args.profile)
        return
    if args.profile:
        child("base", args.precision, args.steps, True)
        return
    if args.products:
        products()
        return
    from clearformer.bench.load import LoadMeter

    meter = LoadMeter(threads=os.cpu_count() or 1).start()
    times: dict[str, list[float]] = {s: [] for s in SETTINGS}
    for _ in range(args.rounds):
        for setting in SETTINGS:
            command = [sys.executable, __file__, "--setting", setting]
            command += ["--precision", args.precision, "--steps", str(args.steps)]
            env = dict(os.environ)
            if setting == "dropout-off":
                env["CLEARFORMER_AVX512_DROPOUT"] = "off"
            done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
            times[setting].append(json.loads(done.stdout.strip().splitlines()[-1])["seconds"])
    print(f"{args.precision} contrastive step, {meter.record().describe()}")
    print("| setting | seconds a step (each round) | vs base |")
    print("| --- | --- | ---: |")
    base = min(times["base"])
    for setting, seconds in times.items():
        shown = " / ".join(f"{s:.2f}" for s in seconds)
        print(f"| {setting} | {shown} | {min(seconds) / base:.2f}x |")


if __name__ == "__main__":
    main()
