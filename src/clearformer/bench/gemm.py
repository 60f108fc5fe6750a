"""The machine's own dense matrix-product rate: the ceiling for an encoder at these sizes."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

from ..machine import machine
from .timing import best_seconds, interleaved
from .workloads import ModelSize


def gemm_rate(size: ModelSize, tokens: int = 4096, repeats: int = 10) -> float:
    """GFLOP/s of the fastest float32 matrix product this machine does on the shapes of one
    encoder layer: the larger of :func:`gemm_rates`' readings (the ceiling every utilisation
    figure is measured against)."""
    return max(gemm_rates(size, tokens, repeats).values())


def layer_products(
    size: ModelSize, tokens: int = 4096
) -> tuple[float, dict[str, Callable[[], None]]]:
    """The four products of one encoder layer (fused QKV, output, feed-forward in and out) on
    ``(tokens, D)`` rows, float32, without bias: their FLOPs, and a function running them
    through ``torch.matmul`` (key ``"matmul"``) and, where this build has it, through oneDNN's
    linear op (``"onednn"``, the one clearformer's fused CPU inference uses, often faster)."""
    D, F = size.d_model, size.dim_mlp
    gen = torch.Generator().manual_seed(0)
    shapes = [(D, 3 * D), (D, D), (D, F), (F, D)]
    xs = [torch.randn(tokens, i, generator=gen) for i, _ in shapes]
    ws = [torch.randn(i, o, generator=gen) for i, o in shapes]
    flops = sum(2.0 * tokens * i * o for i, o in shapes)

    def matmul_products() -> None:
        for x, w in zip(xs, ws, strict=True):
            torch.matmul(x, w)

    runs = {"matmul": matmul_products}
    if machine().onednn:
        rows_out = [w.t().contiguous() for w in ws]  # (out, in), as nn.Linear stores it
        op = torch.ops.mkldnn._linear_pointwise.default

        def onednn_products() -> None:
            for x, w in zip(xs, rows_out, strict=True):
                op(x, w, None, "none", [], "")

        runs["onednn"] = onednn_products
    return flops, runs


def gemm_rates(size: ModelSize, tokens: int = 4096, repeats: int = 10) -> dict[str, float]:
    """GFLOP/s of :func:`layer_products` through each route it has (``"matmul"``, and
    ``"onednn"`` where this build has it).

    Keeps the fastest of ``repeats`` rounds: a ceiling, so a moment of load on a shared machine
    cannot lower it (which would flatter every utilisation figure measured against it).
    """
    flops, runs = layer_products(size, tokens)
    with torch.inference_mode():
        return {
            name: flops / best_seconds(run, warmup=1, repeats=repeats) / 1e9
            for name, run in runs.items()
        }


def sustained_gemm_rate(size: ModelSize, tokens: int = 4096, rounds: int = 40) -> dict[str, float]:
    """:func:`layer_products` through oneDNN's op where this build has it (else
    ``torch.matmul``) run ``rounds`` times in a row: ``{"best": ..., "median": ...}`` GFLOP/s.

    The bound takes the best round, a rate the machine can reach. A whole ``encode`` call runs
    its products one after another at whatever rate each moment gives, so on a host whose rate
    varies from call to call even a pure matrix-product workload stays below the best round:
    the median says by how much (the "sustained" rate).
    """
    flops, runs = layer_products(size, tokens)
    run = runs.get("onednn", runs["matmul"])
    with torch.inference_mode():
        seconds = interleaved({"products": run}, warmup=1, repeats=rounds)["products"]
    return {"best": flops / min(seconds) / 1e9, "median": flops / statistics.median(seconds) / 1e9}
