"""The int8 linear layer's element-wise steps, each compiled into one loop by ``torch.compile``.

In eager PyTorch the steps around the int8 product are separate passes over memory: the
activation's absolute value, its row maxima, the division, rounding and cast; then the int32
result times the token scales, times the channel scales, plus the bias. Measured on the bundled
MiniLM (one thread, CPU time), those passes took longer than the int8 products themselves.
Compiled, each side is one loop: the prologue reads a row twice (maximum, then rounding) and
writes int8; the epilogue reads the int32 result once and writes float32. The arithmetic is the
eager path's (tests compare the two).

Compiled with Inductor's C++ wrapper (``cpp_wrapper``). Its default Python wrapper calls each
compiled kernel with the GIL held, so when ``encode`` runs two batches side by side on threads,
one worker's kernel stops the other worker at its next Python step; the C++ wrapper releases the
GIL for the whole compiled call (docs/int8.md has the measurement).

Compiled once per process with dynamic shapes (one program for every row count and layer
width; Inductor keeps it in its on-disk cache, so a later process loads it instead of compiling).
Where compiling fails (no C++ compiler, an unsupported platform), :func:`fused_steps` says so
once in the log and returns None, and the layers run eagerly.
"""

from __future__ import annotations

import functools
import logging

import torch
from torch import Tensor

log = logging.getLogger(__name__)

QMAX = 127
# The C++ wrapper releases the GIL while the compiled code runs (module docstring).
COMPILE_OPTIONS = {"cpp_wrapper": True}


def prologue(
    rows: Tensor, smooth: Tensor | None, keep: Tensor | None, outliers: Tensor | None
) -> tuple[Tensor, Tensor, Tensor | None]:
    """(M, K) float -> q (M, K) int8, scale (M, 1), and the outlier columns (M, k_o) or None.

    ``keep`` is (K,) with 0 at the outlier channels and 1 elsewhere: those channels do not set
    the row's scale (and saturate in q, where their int8 weights are zero).
    """
    if smooth is not None:
        rows = rows * smooth
    magnitude = rows.abs() if keep is None else rows.abs() * keep
    amax = magnitude.amax(dim=1, keepdim=True)  # (M, 1)
    scale = torch.where(amax > 0, amax / QMAX, 1.0)
    q = torch.clamp(torch.round(rows / scale), -QMAX, QMAX).to(torch.int8)
    x_o = None if outliers is None else rows.index_select(1, outliers)  # (M, k_o)
    return q, scale, x_o


def epilogue(
    acc: Tensor,
    x_scale: Tensor,
    w_scale: Tensor,
    bias: Tensor | None,
    x_o: Tensor | None,
    w_o_t: Tensor | None,
) -> Tensor:
    """int32 (M, N) -> float32 (M, N): ``s_x acc s_w (+ bias) (+ x_o W_o^T)``; the outlier
    product is written as k_o broadcast multiply-adds, so that it joins the same loop."""
    out = acc.to(torch.float32) * x_scale * w_scale
    if bias is not None:
        out = out + bias
    if x_o is not None:
        for j in range(x_o.shape[1]):
            out = out + x_o[:, j : j + 1] * w_o_t[j]
    return out


@functools.cache
def fused_steps():
    """``(prologue, epilogue)`` compiled, or None where compiling does not work here. The C++
    wrapper first; where it does not build (it compiles against PyTorch's C++ headers), the
    default wrapper, which holds the GIL while a kernel runs, with a note in the log."""
    for options in (COMPILE_OPTIONS, {}):
        try:
            return _compiled_steps(options)
        except Exception as error:  # compile errors have no common type (BackendCompilerFailed)
            failure = error
            if options:
                log.info("int8: the C++ wrapper did not build; the default one next: %s", error)
    log.warning("int8: compiling the quantisation steps failed, so they run eagerly: %s", failure)
    return None


def _compiled_steps(options: dict):
    steps = (
        torch.compile(prologue, dynamic=True, options=options),
        torch.compile(epilogue, dynamic=True, options=options),
    )
    # Compile now, on a small input, so that a failure shows here and not mid-encode.
    rows = torch.randn(4, 16)
    keep = torch.ones(16)
    keep[3] = 0
    outliers = torch.tensor([3])
    q, scale, x_o = steps[0](rows, None, keep, outliers)
    acc = q.to(torch.int32) @ torch.ones(16, 8, dtype=torch.int32)
    steps[1](acc, scale, torch.ones(8), torch.zeros(8), x_o, torch.ones(1, 8))
    return steps
