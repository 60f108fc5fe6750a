"""The int8 linear layer's element-wise steps, each compiled into one loop by ``torch.compile``.

In eager PyTorch the steps around the int8 product are separate passes over memory: the
activation's absolute value, its row maxima, the division, rounding and cast; then the int32
result times the token scales, times the channel scales, plus the bias. Measured on the bundled
MiniLM (one thread, CPU time), those passes took longer than the int8 products themselves.
Compiled, each side is one loop: the prologue reads a row twice (maximum, then rounding) and
writes int8; the epilogue reads the int32 result once and writes float32, with the layer's
activation (the feed-forward network's first layer) or the block's residual add (the attention's
output layer, the feed-forward network's second) in the same loop, where the eager layers make
a pass over memory for each. The arithmetic is the eager path's (tests compare the two).

Compiled with Inductor's C++ wrapper (``cpp_wrapper``). Its default Python wrapper calls each
compiled kernel with the GIL held, so when ``encode`` runs two batches side by side on threads,
one worker's kernel stops the other worker at its next Python step; the C++ wrapper releases the
GIL for the whole compiled call (docs/int8.md has the measurement).

Compiled once per process with dynamic shapes (one program for every row count and layer
width, and one per kind of epilogue: plain, with an activation, with a residual add; Inductor
keeps them in its on-disk cache, so a later process loads them instead of compiling).
Where compiling fails (no C++ compiler, an unsupported platform), :func:`fused_steps` says so
once in the log and returns None, and the layers run eagerly.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from ..activations import activation_fn
from .onednn import accumulator_dtype

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
    activation: str | None = None,
    residual: Tensor | None = None,
) -> Tensor:
    """integer sums (M, N), int32 or float32 (:func:`.onednn.accumulator_dtype`) -> float32
    (M, N): ``s_x acc s_w (+ bias) (+ x_o W_o^T)``, then the layer's
    ``activation`` (a name of :func:`clearformer.activations.activation_fn`) and ``+ residual``
    (M, N) where given, in the order the eager layers apply them; the outlier product is written
    as k_o broadcast multiply-adds, so that it joins the same loop."""
    out = acc.to(torch.float32) * x_scale * w_scale
    if bias is not None:
        out = out + bias
    if x_o is not None:
        for j in range(x_o.shape[1]):
            out = out + x_o[:, j : j + 1] * w_o_t[j]
    if activation is not None:
        out = activation_fn(activation)(out)
    if residual is not None:
        out = residual + out
    return out


def activated_epilogue(activation: str, *scaled: Tensor | None) -> Tensor:
    """:func:`epilogue` of ``scaled`` (its first six arguments) with ``activation``. Compiled
    apart from the other two kinds, so that each compiled function holds few variants: with
    every kind in one function, two workers calling it at once sometimes failed Dynamo's guard
    check and compiled it again."""
    return epilogue(*scaled, activation=activation)


def residual_epilogue(residual: Tensor, *scaled: Tensor | None) -> Tensor:
    """:func:`epilogue` of ``scaled`` with ``+ residual``, compiled on its own (as
    :func:`activated_epilogue`)."""
    return epilogue(*scaled, residual=residual)


class FusedSteps(NamedTuple):
    """The compiled steps: the prologue and the three kinds of epilogue."""

    prologue: Callable
    epilogue: Callable
    activated_epilogue: Callable
    residual_epilogue: Callable


@functools.cache
def fused_steps() -> FusedSteps | None:
    """The steps compiled (:class:`FusedSteps`), or None where compiling does not work here.
    The C++ wrapper first; where it does not build (it compiles against PyTorch's C++ headers),
    the default wrapper, which holds the GIL while a kernel runs, with a note in the log."""
    for options in (COMPILE_OPTIONS, {}):
        try:
            return _compiled_steps(options)
        except Exception as error:  # compile errors have no common type (BackendCompilerFailed)
            failure = error
            if options:
                log.info("int8: the C++ wrapper did not build; the default one next: %s", error)
    log.warning("int8: compiling the quantisation steps failed, so they run eagerly: %s", failure)
    return None


def _compiled_steps(options: dict) -> FusedSteps:
    steps = FusedSteps(
        *(
            torch.compile(step, dynamic=True, options=options)
            for step in (prologue, epilogue, activated_epilogue, residual_epilogue)
        )
    )
    # Compile now, on a small input, so that a failure shows here and not mid-encode (the
    # other two kinds compile on their first call: the model's warm-up, TextEncoder.int8_model).
    rows = torch.randn(4, 16)
    keep = torch.ones(16)
    keep[3] = 0
    outliers = torch.tensor([3])
    q, scale, x_o = steps.prologue(rows, None, keep, outliers)
    acc = (q.to(torch.int32) @ torch.ones(16, 8, dtype=torch.int32)).to(accumulator_dtype())
    steps.epilogue(acc, scale, torch.ones(8), torch.zeros(8), x_o, torch.ones(1, 8))
    return steps
