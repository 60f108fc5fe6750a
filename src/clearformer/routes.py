"""How a call runs: every route choice of the forward plan, made here and nowhere else.

:mod:`clearformer.plan` says what a call means (its mask, causal flag, windows, rotary tables,
bias, the outputs asked for); this module chooses, for that meaning, the implementation that
runs it on this machine, each choice with its reason:

* the linear layers: the eager ``nn.Linear`` calls, or whole blocks with their residual adds and
  norms fused into the matrix products (:mod:`clearformer.fast.fused_blocks`);
* on packed rows, the varlen method (:mod:`clearformer.fast.varlen`), asking each method whether
  it serves the call (a causal mask, a local window, a score bias, the dtype, the device);
* on long padded rows of a local layer, whether attention runs slab by slab.

The layers never import :mod:`clearformer.fast`: they run the implementation the plan names.
"""

from __future__ import annotations

import torch
from torch import nn

from .fast import fused_blocks
from .fast.fused_linear import fusion_decision
from .fast.local import use_banded
from .fast.varlen import VarlenCall, resolve_method
from .options import Decision
from .padding import PackedLayout

__all__ = ["linear_route", "slab_by_slab", "varlen_method"]


def linear_route(
    device: torch.device, dtype: torch.dtype, training: bool, module: nn.Module | None
) -> Decision:
    """``fused`` (naming :mod:`clearformer.fast.fused_blocks`) or ``eager``, and why, for a call
    of ``module`` on rows on ``device`` in ``dtype``."""
    decision = fusion_decision(device, dtype, training, module)
    if decision.choice != "fused":
        return decision
    return Decision(decision.choice, decision.reason, impl=fused_blocks)


def varlen_method(
    layout: PackedLayout,
    *,
    device: torch.device,
    dtype: torch.dtype,
    head_dim: int | None,
    is_causal: bool,
    window: int | None = None,
    bias: bool = False,
) -> Decision:
    """The varlen method for one layer's packed rows, and why: the first that serves the call
    in the order of :func:`clearformer.fast.varlen.resolve_method`."""
    call = VarlenCall(
        device,
        dtype,
        head_dim,
        is_causal,
        window=window is not None,
        bias=bias,
        grad=torch.is_grad_enabled(),
    )
    return resolve_method("auto", layout, call=call)


def slab_by_slab(length: int, window: int) -> bool:
    """Whether a padded local layer of ``length`` rows runs slab by slab (no (T, T) band)."""
    return use_banded(length, window)
