"""int8 matrix products at an encoder layer's shapes: ``torch._int_mm`` against oneDNN's
quantised linear op (``onednn::qlinear_pointwise``, the weight packed once), and float32.

``torch._int_mm`` on CPU runs oneDNN's older GEMM interface; the int8 layers take the
quantised linear op where it runs (:mod:`clearformer.quant.onednn`). Both give the same integer
sums (checked here on every shape before timing). One process, the three products of a shape
timed back to back in each round, the best of ``--repeats`` rounds, glibc keeping freed
memory (as ``encode`` runs: without it every large result is a fresh mapping whose page faults
cost more than the product). Load average recorded before and after.

Run: ``python benchmarks/int8_products.py [--threads 1] [--repeats 20] [--size minilm]``
"""

from __future__ import annotations

import argparse
import os
import time

import torch


def best_seconds(repeats: int, call, *args) -> float:
    call(*args)
    call(*args)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        call(*args)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    from clearformer.bench.workloads import SIZES
    from clearformer.quant.onednn import int8_product, onednn_int8_available
    from clearformer.runtime import retain_freed_memory

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--size", default="minilm", choices=sorted(SIZES))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    retain_freed_memory()
    if not onednn_int8_available():
        raise SystemExit("oneDNN's quantised linear op does not run here")
    size = SIZES[args.size]
    D, F = size.d_model, size.dim_mlp
    shapes = [(D, 3 * D), (D, D), (D, F), (F, D)]  # (K, N): QKV, output, FFN in, FFN out
    load = os.getloadavg()[0]
    print(f"load average {load:.2f}; {args.threads} thread(s); torch {torch.__version__}")
    print("| M | K | N | `_int_mm` GOP/s | oneDNN op GOP/s | speed-up | float32 GFLOP/s |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for M in (256, 1024, 2048, 4096):
            for K, N in shapes:
                q = torch.randint(-127, 128, (M, K), dtype=torch.int8, generator=gen)
                w = torch.randint(-127, 128, (N, K), dtype=torch.int8, generator=gen)
                if not torch.equal(int8_product(q, w), torch._int_mm(q, w.t()).float()):
                    raise SystemExit(f"the products differ at M={M} K={K} N={N}")
                qf, wf = q.float(), w.float()
                ops = 2 * M * K * N / 1e9
                int_mm = ops / best_seconds(args.repeats, torch._int_mm, q, w.t())
                onednn = ops / best_seconds(args.repeats, int8_product, q, w)
                fp32 = ops / best_seconds(args.repeats, torch.nn.functional.linear, qf, wf)
                print(
                    f"| {M} | {K} | {N} | {int_mm:,.0f} | {onednn:,.0f} | {onednn / int_mm:.2f}x "
                    f"| {fp32:,.0f} |",
                    flush=True,
                )
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
