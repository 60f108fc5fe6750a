"""Attention through ``torch.nn.functional.scaled_dot_product_attention``.

PyTorch picks a fused kernel (flash attention on CPU and CUDA, memory-efficient attention on
CUDA) that never materialises the (Tq, Tk) score matrix, so memory stays linear in T.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .math import combine_masks


def sdpa_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    *,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
    need_weights: bool = False,
) -> tuple[Tensor, None]:
    """Same contract as :func:`clearformer.attention.math.math_attention`, without weights.

    Args:
        q: (B, H, Tq, Dh), k: (B, H, Tk, Dh), v: (B, H, Tk, Dv), mask broadcastable to
        (B, H, Tq, Tk) with True = takes part.
    """
    if need_weights:
        raise ValueError(
            "need_weights=True: the 'sdpa' backend cannot return attention weights; "
            "use backend='math' (or 'auto', which picks 'math' when weights are requested)"
        )
    tq, tk = q.shape[-2], k.shape[-2]
    # SDPA's own is_causal is top-left aligned; it equals ours only when Tq == Tk.
    if mask is None and (not is_causal or tq == tk):
        out = F.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout_p, is_causal=is_causal, scale=scale
        )
        return out, None
    mask = combine_masks(mask, is_causal, tq, tk, q.device)
    # A query with no key to attend must give zeros, with finite gradients, on every build and
    # kernel: let such rows attend everywhere (finite, harmless) and zero their output after.
    has_key = mask.any(dim=-1, keepdim=True)  # (B, H|1, Tq|1, 1)
    if q.device.type == "cpu" and not torch.compiler.is_compiling() and bool(has_key.all()):
        # The usual case, every query has a key: skip the mask's OR and the output's where.
        # On CPU reading the flag is free; on an accelerator it would wait for the device, and
        # under torch.compile it would break the graph, so there both passes stay.
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale
        )
        return out, None
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask | ~has_key, dropout_p=dropout_p, scale=scale
    )  # (B, H, Tq, Dv)
    # torch.where keeps the kernel's (B, Tq, H, Dv) memory order, so the head merge that follows
    # stays a view (masked_fill's clone made it contiguous in (B, H, Tq, Dv), costing a copy).
    return torch.where(has_key, out, 0.0), None
