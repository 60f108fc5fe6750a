"""Attention kernels, all behind one signature: ``kernel(q, k, v, plan, dropout_p, scale, bias)``.

Each takes queries, keys and values already split into heads in the plan's layout (padded:
``(B, H, T, Dh)``; packed: ``(N, H, Dh)``; keys and values may have fewer heads, Hkv, a
divisor of H: grouped-query attention) and the scores' scale (None: Dh ** -0.5), and returns
``(out, weights)``, ``out`` in the queries' layout and ``weights`` (B, H, Tq, Tk) from ``math``
on request, else None; ``bias`` is the stack's (H, L, L) score bias for the call, or None. They
read what the layer's plan prepared once for the call (the mask with its causal fold, which
rows have a key, the packed layout) and run the implementation it names (the varlen method,
clearformer's AVX-512 kernel or PyTorch's): they never decide, nor re-check.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from torch import Tensor

from ..fast.counter_dropout import dropout
from ..fast.local import banded_attention
from ..fast.varlen import attend
from ..options import KERNEL_NAMES
from ..ran import note
from .math import math_attention
from .sdpa import local_flash_attention, sdpa_attention

if TYPE_CHECKING:  # the plan imports the kernels' rules; the kernels only read the plan
    from ..forward_plan import LayerPlan

__all__ = ["KERNELS", "Kernel", "dropout", "math_attention", "sdpa_attention"]

Kernel = Callable[
    [Tensor, Tensor, Tensor, "LayerPlan", float, "float | None", "Tensor | None"],
    tuple[Tensor, Tensor | None],
]


def _math(q: Tensor, k: Tensor, v: Tensor, plan: LayerPlan, dropout_p: float, scale, bias):
    if plan.packing is not None:  # the reference formula, sequence by sequence
        out = attend(
            q,
            k,
            v,
            plan.packing,
            "sequence",
            is_causal=plan.is_causal,
            dropout_p=dropout_p,
            scale=scale,
            reference=True,
            window=plan.window,
            bias=bias,
        )
        return out, None
    note("attention", "math")
    return math_attention(
        q,
        k,
        v,
        plan.mask,
        is_causal=plan.is_causal,
        dropout_p=dropout_p,
        scale=scale,
        need_weights=plan.need_weights,
        bias=_padded_bias(plan, bias),
    )


def _padded_bias(plan: LayerPlan, bias: Tensor | None) -> Tensor | None:
    """The call's (H, L, L) score bias cut to the layer's (1, H, Tq, Tk), or None."""
    if bias is None:
        return None
    return bias[None, :, : plan.tq, : plan.tk]


def _sdpa(q: Tensor, k: Tensor, v: Tensor, plan: LayerPlan, dropout_p: float, scale, bias):
    flash = plan.padded_route is not None and plan.padded_route.choice == "avx512"
    if plan.window is not None and flash and bias is None and dropout_p == 0.0:
        # Unmasked rows of a local layer: the flash kernel reads the window itself, and the
        # causal constraint from the layer (the plan folded it into a mask this kernel skips).
        causal = plan.causal or plan.is_causal
        out = local_flash_attention(q, k, v, plan.window, is_causal=causal, scale=scale)
        if out is not None:
            note("attention", "avx512")
            return out, None
    if plan.window is not None and not plan.band_in_mask:
        note("attention", "banded")
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
        bias=_padded_bias(plan, bias),
        # A local layer's band may be folded into its mask, which the AVX-512 route ignores.
        avx512=flash and plan.window is None,
        key_runs=plan.key_runs,
    )


def _varlen(q: Tensor, k: Tensor, v: Tensor, plan: LayerPlan, dropout_p: float, scale, bias):
    out = attend(
        q,
        k,
        v,
        plan.packing,
        plan.method.choice,
        is_causal=plan.is_causal,
        dropout_p=dropout_p,
        scale=scale,
        window=plan.window,
        bias=bias,
    )
    return out, None


KERNELS: dict[str, Kernel] = {"math": _math, "sdpa": _sdpa, "varlen": _varlen}
assert tuple(KERNELS) == KERNEL_NAMES, "every kernel name of clearformer.options has a kernel"
