"""Attention on packed rows by a method's name, for callers outside a plan (tests, benchmarks,
calibration): the method named, or ``auto``'s, resolved by the routes, then run.

A stack's layers never come here: their plan names the method already
(:func:`clearformer.routes.varlen_method`) and the kernel runs it
(:func:`clearformer.fast.varlen.attend`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import routes
from .checks import check_choice
from .fast.varlen import attend
from .options import VARLEN_METHODS, Decision
from .padding import PackedLayout

__all__ = ["varlen_attention"]


def varlen_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    layout: PackedLayout,
    *,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
    reference: bool = False,
    method: str = "auto",
    window: int | None = None,
    bias: Tensor | None = None,
) -> Tensor:
    """Self-attention within each packed sequence (see :func:`clearformer.fast.varlen.attend`
    for the arguments), by ``method``: one of ``VARLEN_METHODS``; ``auto`` takes what a plan
    would. A method named that cannot serve the call raises, naming what it needs, except
    ``avx512``, which sends a call it does not serve (causal, a window, a bias, dropout,
    grouped keys, gradients) where ``auto`` would without it."""
    check_choice(method, VARLEN_METHODS, "method")
    if reference or layout.num_tokens == 0:
        return attend(
            q,
            k,
            v,
            layout,
            "sequence",
            is_causal=is_causal,
            dropout_p=dropout_p,
            scale=scale,
            reference=reference,
            window=window,
            bias=bias,
        )
    call = routes.VarlenCall(
        q.device,
        q.dtype,
        q.shape[-1],
        is_causal,
        window=window is not None,
        bias=bias is not None,
        dropout=dropout_p > 0.0,
        grad=torch.is_grad_enabled() and q.requires_grad,
        grouped=k.shape[1] != q.shape[1],
        value_dim=v.shape[-1],
    )
    if method == "avx512" and routes.attention_kernel_for(call)[1].choice != "serves":
        refusal = routes.avx512_refusal()
        if refusal is not None:
            raise ValueError(f"method='avx512' cannot run here: {refusal}")
        taken = Decision("torch", "named 'avx512', which declines this call")
        resolved = routes.varlen_method(layout, call, "auto", avx512_taken=taken)
    else:
        resolved = routes.varlen_method(layout, call, method)
    return attend(
        q,
        k,
        v,
        layout,
        resolved.choice,
        is_causal=is_causal,
        dropout_p=dropout_p,
        scale=scale,
        window=window,
        bias=bias,
    )
