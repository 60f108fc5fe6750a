"""The whole encoder stack on a ragged batch with each packed-attention method, quiet and with
competing processes: ``auto`` must not be slower than ``padded`` when the cores are contended.

    python benchmarks/varlen_under_load.py [--size minilm] [--spinners 4] [--repeats 3]

``--spinners N`` starts N busy Python processes (pure interpreter loops) for the duration, as
other jobs on a shared machine would; 0 measures the machine as it is. The methods are forced
per call through the plan's varlen decision; ``torch.nn`` is the post-norm encoder's
nested-tensor path. Medians of ``--repeats`` rounds, taking turns; how many CPUs other
processes kept busy, the spinners counted among them (clearformer.bench.load), is printed.
glibc keeps freed memory, as in ``clearformer bench``
(:func:`clearformer.runtime.retain_freed_memory`).
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import statistics
import time

import torch
from torch import nn


def spin() -> None:
    while True:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--size",
        choices=("minilm", "bert-base"),
        default="minilm",
        help="width and depth of the stack (default %(default)s)",
    )
    parser.add_argument(
        "--spinners",
        type=int,
        default=0,
        help="busy processes started for the duration, as competing jobs (default %(default)s)",
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="rounds; medians reported (default %(default)s)"
    )
    args = parser.parse_args()
    from clearformer.runtime import retain_freed_memory

    retain_freed_memory()  # as clearformer bench does: torch.nn's nested path needs it most

    import clearformer.plan as plan_module
    from clearformer import Encoder, EncoderConfig
    from clearformer.options import Decision

    D, H, F, L = (384, 12, 1536, 6) if args.size == "minilm" else (768, 12, 3072, 12)
    torch.manual_seed(0)
    rng = random.Random(0)
    lengths = [rng.randint(16, 256) for _ in range(32)]
    x = torch.randn(32, 256, D)
    mask = torch.arange(256)[None] < torch.tensor(lengths)[:, None]  # (B, T)
    config = EncoderConfig(
        d_model=D, n_heads=H, n_layers=L, dim_mlp=F, norm="post", activation="gelu"
    )
    ours = Encoder(config).eval()
    layer = nn.TransformerEncoderLayer(D, H, F, 0.0, "gelu", batch_first=True)
    theirs = nn.TransformerEncoder(layer, L, enable_nested_tensor=True).eval()

    original = plan_module.varlen_method
    forced: dict[str, str | None] = {"method": None}

    def resolve(layout, **kwargs):
        if forced["method"] is None:
            return original(layout, **kwargs)
        return Decision(forced["method"], "forced by the benchmark")

    plan_module.varlen_method = resolve
    runs = {
        "torch.nn nested": lambda: theirs(x, src_key_padding_mask=~mask),
        "auto": lambda: ours(x, mask),
        "sequence": lambda: ours(x, mask),
        "threads": lambda: ours(x, mask),
        "padded": lambda: ours(x, mask),
    }
    spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.spinners)]
    for p in spinners:
        p.start()
    from clearformer.bench.load import LoadMeter

    # The spinners are this process's children, but load on purpose: counted as others'.
    meter = LoadMeter(threads=torch.get_num_threads(), exclude=lambda: [p.pid for p in spinners])
    meter.start()
    times: dict[str, list[float]] = {name: [] for name in runs}
    try:
        with torch.inference_mode():
            for round_ in range(args.repeats + 1):
                for name, run in runs.items():
                    forced["method"] = name if name in ("sequence", "threads", "padded") else None
                    start = time.perf_counter()
                    run()
                    if round_:  # the first round warms up
                        times[name].append(time.perf_counter() - start)
        load = meter.record()  # before the spinners end: reaped, they would count as ours
    finally:
        for p in spinners:
            p.terminate()
    print(
        f"{args.size} stack, ragged B 32 U[16, 256], {torch.get_num_threads()} threads, "
        f"{args.spinners} spinners; {load.describe()}"
    )
    base = statistics.median(times["torch.nn nested"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"  {name:>16}: {1e3 * median:9.1f} ms   x torch.nn {base / median:5.2f}")


if __name__ == "__main__":
    main()
