"""clearformer's own linear layers for AVX-512 CPUs, with their epilogue in registers.

oneDNN's fused linear op (:mod:`clearformer.fast.fused_linear`) serves the CPU's float32 inference
products, with the bias, activation or residual add as post-operations. Two things stay
outside its product at a BERT-style layer's shapes: the exact GELU's ``erf``, which its
post-op evaluates through an exponential and a division, and a post-norm block's LayerNorm,
a separate pass over the rows after each residual add. ``avx512_linear.cpp`` (beside this
file, built into the AVX-512 library with the attention kernel) computes the product in
register tiles whose rows are whole output rows, then the bias, a table-based exact GELU or
the residual add and the LayerNorm while the rows are still in cache.

Its plain product is slower than oneDNN's on a batch's products with few inputs (384), so it
serves only the calls that carry such an epilogue: the exact GELU, or a LayerNorm after the
product (:func:`serves`), at every row count; the others stay with oneDNN at every row count,
so that a row takes the same products alone and in a batch. On a sentence's few rows (at most
:data:`FEW_ROWS`) it streams each panel of the weight once against every row tile, under a
verdict of its own (``avx512_linear_rows``). The plan takes it where the library is built
and this CPU measured it faster than oneDNN at MiniLM's shapes
(:func:`clearformer.routes.epilogue_route`, :mod:`clearformer.calibration`), so two equal calls
may differ by float32 rounding before and after a measurement; a layer whose calls go both
ways keeps a packed copy in each kernel's layout. It runs on weights reordered once per caller (a
:class:`~clearformer.fast.reordered_weights.ReorderedWeights` in use: ``encode``, ``predict``,
``generate``), never per call. Each output element is one sum in a fixed order, so results
do not depend on the thread count; against oneDNN they differ by float32 rounding (tests hold
both to the float64 reference). What it saves is measured in docs/performance.md ("Products
with their epilogue").

``CLEARFORMER_AVX512_LINEAR=off`` keeps every product on oneDNN, and so do
``CLEARFORMER_AVX512=off`` and ``CLEARFORMER_KERNELS=off``; ``=on`` takes it unmeasured
(:mod:`clearformer.switches`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

PANEL = 64  # output columns per packed panel: out_features must be a multiple
ACTIVATIONS = {"relu": 1, "gelu": 2}  # name -> the kernel's activation code (gelu: exact)
# The activations calls bring here: the exact GELU, whose erf oneDNN's post-op pays for. The
# kernel computes ReLU too (tested), but oneDNN's ReLU costs next to nothing, and oneDNN's
# plain product is the faster one.
ROUTED_ACTIVATIONS = ("gelu",)
TILE_ROWS = 6  # rows per register tile: threads split the rows tile by tile
# At most this many rows (one sentence's tokens), the route asks the kernel's few-rows verdict
# (routes.epilogue_route). The kernel itself streams each weight panel once against every row
# tile there, and wherever it has fewer row tiles than threads (avx512_linear.cpp's FEW_ROWS,
# the same number): the same sums either way, so the order is the kernel's own business.
FEW_ROWS = 64


def fusable_norm(norm: nn.Module | None, width: int) -> bool:
    """``norm`` is a plain ``nn.LayerNorm`` over the last ``width`` features, with float32
    weight and bias, which the kernel computes as torch does."""
    return (
        type(norm) is nn.LayerNorm
        and norm.normalized_shape == (width,)
        and norm.weight is not None
        and norm.bias is not None
        and norm.weight.dtype == norm.bias.dtype == torch.float32
        and norm.weight.is_contiguous()
        and norm.bias.is_contiguous()
        and not (norm._forward_hooks or norm._forward_pre_hooks)
    )


def serves(
    rows: Tensor,
    layer: nn.Linear,
    activation: str | None,
    residual: Tensor | None,
    norm: nn.Module | None,
) -> bool:
    """Whether the kernel can take this fused call, which the plan sends here: ``rows`` (M, in)
    float32 on the CPU, ``layer``'s outputs a multiple of 64, and an epilogue the kernel wins
    on (the exact GELU, or a fusable LayerNorm after the product), at any row count (with few
    rows the kernel splits the weight's panels between threads, else the rows). The same kinds
    of product at every row count: a text's row then takes the same sums alone and in a batch
    (the kernel's two orders add alike), where plain products stay with oneDNN either way."""
    if activation is None and norm is None:
        return False
    if activation is not None and activation not in ROUTED_ACTIVATIONS:
        return False
    if norm is not None and not fusable_norm(norm, layer.out_features):
        return False
    if residual is not None and (residual.dtype != torch.float32 or residual.stride(-1) != 1):
        return False
    return (
        layer.out_features % PANEL == 0
        and rows.shape[0] > 0
        and rows.device.type == "cpu"
        and rows.dtype == layer.weight.dtype == torch.float32
        and rows.stride(-1) == 1
        and (layer.bias is None or layer.bias.is_contiguous())
    )


def reorder(weight: Tensor) -> Tensor:
    """``weight`` (out, in) in the kernel's panels: (out / 64, in, 64)."""
    return torch.ops.clearformer_avx512.pack_linear_weight(weight.detach())


def linear(
    rows: Tensor,
    packed: Tensor,
    layer: nn.Linear,
    *,
    activation: str | None = None,
    residual: Tensor | None = None,
    norm: nn.LayerNorm | None = None,
) -> Tensor:
    """``norm(act(rows @ layer.weight^T + layer.bias) + residual)``, each step optional:
    ``rows`` (M, in), ``packed`` from :func:`reorder`, ``residual`` (M, out); returns (M, out).
    The caller checked :func:`serves`."""
    return torch.ops.clearformer_avx512.linear(
        rows,
        packed,
        layer.bias,
        ACTIVATIONS[activation] if activation is not None else 0,
        residual,
        norm.weight if norm is not None else None,
        norm.bias if norm is not None else None,
        norm.eps if norm is not None else 0.0,
    )
