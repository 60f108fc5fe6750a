"""clearformer's AVX-512 attention kernel against PyTorch's flash kernel, by sequence length.

For each length, about 4,096 tokens of sequences of that one length (12 heads, float32): the
flash kernel on (B, H, T, Dh) views of the rows (no padding: every sequence is full), the
kernel on the same rows packed, each its best of ``--repeats`` calls; GFLOP/s counts the two
products (4 B H T^2 Dh). The largest difference between the two outputs is printed too. Builds
the kernel first where it is not built yet (a few seconds, once).

Run: ``python benchmarks/avx512_attention_lengths.py [--threads 1] [--head-dim 32]``, on a quiet
machine (the load average before and after is printed with the table).
"""

from __future__ import annotations

import argparse

LENGTHS = (8, 16, 20, 24, 32, 48, 64, 100, 128, 192, 256)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (default %(default)s)"
    )
    parser.add_argument(
        "--head-dim", type=int, default=32, help="head width Dh (default %(default)s)"
    )
    parser.add_argument("--heads", type=int, default=12, help="heads H (default %(default)s)")
    parser.add_argument(
        "--repeats",
        type=int,
        default=10,
        help="calls of each; the best counts (default %(default)s)",
    )
    args = parser.parse_args()

    import torch
    import torch.nn.functional as F

    from clearformer.bench.load import LoadMeter
    from clearformer.bench.timing import best_seconds
    from clearformer.fast import avx512

    torch.set_num_threads(args.threads)
    meter = LoadMeter(threads=args.threads).start()
    loaded = avx512.load(build=True)
    if loaded.choice != "loaded":
        parser.error(f"the AVX-512 kernel cannot run here: {loaded.reason}")
    H, Dh = args.heads, args.head_dim
    rows, worst = [], 0.0
    with torch.inference_mode():
        for T in LENGTHS:
            B = max(1, 4096 // T)
            N = B * T
            q, k, v = torch.randn(N, 3, H, Dh).unbind(1)  # (N, H, Dh) views, as attention gets
            cu = torch.arange(0, N + 1, T, dtype=torch.int64)
            padded = [t.reshape(B, T, H, Dh).transpose(1, 2) for t in (q, k, v)]  # (B, H, T, Dh)
            flops = 4.0 * B * H * T * T * Dh
            packed = (q, k, v, cu, Dh**-0.5)
            flash = best_seconds(
                lambda p=padded: F.scaled_dot_product_attention(*p), warmup=2, repeats=args.repeats
            )
            ours = best_seconds(
                lambda p=packed: avx512.attention(*p), warmup=2, repeats=args.repeats
            )
            want = F.scaled_dot_product_attention(*padded).transpose(1, 2).reshape(N, H, Dh)
            worst = max(worst, (avx512.attention(*packed) - want).abs().max().item())
            rows.append((T, flops / flash / 1e9, flops / ours / 1e9, flash / ours))
    verdict = meter.record()
    print(f"{args.threads} thread(s), {H} heads of {Dh}. {verdict.describe()}")
    print("| tokens per sequence | " + " | ".join(str(r[0]) for r in rows) + " |")
    print("| --- |" + " ---: |" * len(rows))
    print("| flash, GFLOP/s | " + " | ".join(f"{r[1]:.1f}" for r in rows) + " |")
    print("| `avx512`, GFLOP/s | " + " | ".join(f"{r[2]:.1f}" for r in rows) + " |")
    print("| speed-up | " + " | ".join(f"{r[3]:.2f}x" for r in rows) + " |")
    print(f"largest difference from the flash output: {worst:.1e}")


if __name__ == "__main__":
    main()
