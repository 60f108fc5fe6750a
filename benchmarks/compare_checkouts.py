"""Two checkouts of clearformer side by side: per-call latency of the encoder stack and of
``TextEncoder.encode``, in alternating processes.

Usage (from the repository root, on a quiet machine)::

    git worktree add /tmp/clearformer-base <commit>
    python benchmarks/compare_checkouts.py --base /tmp/clearformer-base/src --head src

Each round runs one process per checkout, in turns (base, head, head, base, ...), so that a
slow spell of the machine hits both; each process times every workload and keeps its median.
The report is each workload's median over the rounds and the ratio base / head (above 1: the
head is faster), and the ratio of each side's fastest round (steadier where a shared machine
runs whole processes at two speeds). Only APIs that both checkouts have are used:
``Encoder(config)(x, mask)`` and ``TextEncoder.from_pretrained().encode(texts)``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from clearformer.io import write_text_atomically

WORKER = r"""
import json, statistics, sys, time
import torch
from clearformer import Encoder, EncoderConfig
from clearformer.runtime import retain_freed_memory

retain_freed_memory()  # as the CLI does: no fresh page faults per call (docs/performance.md)
torch.manual_seed(0)
repeats = int(sys.argv[1])
results = {}


def median_ms(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def mask_of(lengths):
    T = max(lengths)
    return torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]


minilm = dict(d_model=384, n_heads=12, n_layers=6, dim_mlp=1536, norm="post", activation="gelu")
tiny = dict(minilm, d_model=64, n_heads=4, dim_mlp=128)  # per-call overhead dominates
cases = [
    ("tiny 6x64 B2 ragged (packed)", "auto", [8, 3], True, tiny),
    ("tiny 6x64 B2 ragged sdpa", "sdpa", [8, 3], True, tiny),
    ("MiniLM B1 T16 no mask", "auto", [16], False, minilm),
    ("MiniLM B4 ragged 5-16 (packed)", "auto", [16, 9, 5, 12], True, minilm),
    ("MiniLM B4 ragged 5-16 sdpa", "sdpa", [16, 9, 5, 12], True, minilm),
    ("MiniLM B32 ragged 16-128 (packed)", "auto", [16 + (i * 37) % 113 for i in range(32)], True,
     minilm),
]
with torch.inference_mode():
    for name, backend, lengths, masked, size in cases:
        encoder = Encoder(EncoderConfig(**size, backend=backend)).eval()
        mask = mask_of(lengths) if masked else None
        x = torch.randn(len(lengths), max(lengths), size["d_model"])
        reps = repeats * (10 if len(lengths) <= 4 else 1)
        results[name] = median_ms(lambda: encoder(x, mask), reps)

from clearformer import TextEncoder

text_encoder = TextEncoder.from_pretrained()
one = ["A cat sits on the mat."]
few = ["A cat sits on the mat.", "Stock markets fell sharply today.", "Dogs bark.",
       "The weather today is sunny with a light breeze from the west."]
results["encode 1 text"] = median_ms(lambda: text_encoder.encode(one), repeats * 10)
results["encode 4 texts"] = median_ms(lambda: text_encoder.encode(few), repeats * 10)
print(json.dumps(results))
"""


def run(src: Path, repeats: int, threads: int | None) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(src.resolve()), HF_HUB_OFFLINE="1")
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    out = subprocess.run(
        [sys.executable, "-c", WORKER, str(repeats)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--base", type=Path, required=True, help="src/ folder of the reference checkout (required)"
    )
    parser.add_argument(
        "--head",
        type=Path,
        default=Path("src"),
        help="src/ folder of the checkout under test (default %(default)s)",
    )
    parser.add_argument(
        "--rounds", type=int, default=4, help="process pairs, taking turns (default %(default)s)"
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=5,
        help="timed calls per workload in each process (default %(default)s)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="OMP_NUM_THREADS of each process (default: inherited)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="write the medians and every run to OUT.json (default: print only)",
    )
    args = parser.parse_args()
    from clearformer.bench.load import LoadMeter

    # The timed processes are this one's children: their CPU time is the run's own.
    meter = LoadMeter(threads=args.threads or os.cpu_count() or 1).start()
    runs: dict[str, list[dict[str, float]]] = {"base": [], "head": []}
    for i in range(args.rounds):
        order = ("base", "head") if i % 2 == 0 else ("head", "base")
        for which in order:
            runs[which].append(run(getattr(args, which), args.repeats, args.threads))
    load = meter.record()
    rows = []
    for name in runs["head"][0]:
        base = statistics.median(r[name] for r in runs["base"])
        head = statistics.median(r[name] for r in runs["head"])
        # A shared machine can run a whole process fast or slow: the fastest round of each
        # side is the steadier ratio where the rounds split between two speeds.
        fastest = min(r[name] for r in runs["base"]) / min(r[name] for r in runs["head"])
        rows.append(
            {
                "workload": name,
                "base_ms": base,
                "head_ms": head,
                "ratio": base / head,
                "fastest_ratio": fastest,
            }
        )
    print(load.describe())
    print(f"{'workload':36} {'base ms':>9} {'head ms':>9} {'base/head':>10} {'fastest':>8}")
    for r in rows:
        print(
            f"{r['workload']:36} {r['base_ms']:9.2f} {r['head_ms']:9.2f} {r['ratio']:9.2f}x "
            f"{r['fastest_ratio']:7.2f}x"
        )
    if args.out is not None:
        from clearformer.cpu import cpu_description

        record = {"load": load.to_dict(), "cpu": cpu_description(), "rows": rows, "runs": runs}
        write_text_atomically(args.out, json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
