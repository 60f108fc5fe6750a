"""Attention kernels, all behind one signature: ``kernel(q, k, v, plan, dropout_p, scale)``.

Each takes queries, keys and values already split into heads in the plan's layout (padded:
``(B, H, T, Dh)``; packed: ``(N, H, Dh)``; keys and values may have fewer heads, Hkv, a
divisor of H: grouped-query attention) and the scores' scale (None: Dh ** -0.5), and returns
``(out, weights)``, ``out`` in the queries' layout and ``weights`` (B, H, Tq, Tk) from ``math``
on request, else None. They read what the
forward plan prepared once for the call (the mask with its causal fold, which rows have a key,
the packed layout and the varlen method) and never re-check it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from torch import Tensor

from ..fast.local import banded_attention
from ..fast.varlen import varlen_attention
from ..options import KERNEL_NAMES
from .math import math_attention
from .sdpa import sdpa_attention

if TYPE_CHECKING:  # the plan imports the kernels' rules; the kernels only read the plan
    from ..plan import ForwardPlan

__all__ = ["KERNELS", "Kernel", "math_attention", "sdpa_attention", "varlen_attention"]

Kernel = Callable[
    [Tensor, Tensor, Tensor, "ForwardPlan", float, "float | None"], tuple[Tensor, Tensor | None]
]


def _math(q: Tensor, k: Tensor, v: Tensor, plan: ForwardPlan, dropout_p: float, scale=None):
    if plan.packing is not None:  # the reference formula, sequence by sequence
        out = varlen_attention(
            q,
            k,
            v,
            plan.packing,
            is_causal=plan.is_causal,
            dropout_p=dropout_p,
            scale=scale,
            reference=True,
            window=plan.window,
            bias=plan.score_bias,
        )
        return out, None
    return math_attention(
        q,
        k,
        v,
        plan.mask,
        is_causal=plan.is_causal,
        dropout_p=dropout_p,
        scale=scale,
        need_weights=plan.need_weights,
        bias=_padded_bias(plan),
    )


def _padded_bias(plan: ForwardPlan) -> Tensor | None:
    """The plan's (H, L, L) score bias cut to the call's (1, H, Tq, Tk), or None."""
    if plan.score_bias is None:
        return None
    return plan.score_bias[None, :, : plan.tq, : plan.tk]


def _sdpa(q: Tensor, k: Tensor, v: Tensor, plan: ForwardPlan, dropout_p: float, scale=None):
    if plan.window is not None and not plan.band_in_mask:
        out = banded_attention(
            q,
            k,
            v,
            plan.window,
            plan.mask,
            is_causal=plan.is_causal,
            dropout_p=dropout_p,
            scale=scale,
        )
        return out, None
    return sdpa_attention(
        q,
        k,
        v,
        plan.mask,
        is_causal=plan.is_causal,
        dropout_p=dropout_p,
        scale=scale,
        query_has_key=plan.query_has_key,
        bias=_padded_bias(plan),
    )


def _varlen(q: Tensor, k: Tensor, v: Tensor, plan: ForwardPlan, dropout_p: float, scale=None):
    out = varlen_attention(
        q,
        k,
        v,
        plan.packing,
        is_causal=plan.is_causal,
        dropout_p=dropout_p,
        scale=scale,
        method=plan.method.choice,
        window=plan.window,
        bias=plan.score_bias,
    )
    return out, None


KERNELS: dict[str, Kernel] = {"math": _math, "sdpa": _sdpa, "varlen": _varlen}
assert tuple(KERNELS) == KERNEL_NAMES, "every kernel name of clearformer.options has a kernel"
