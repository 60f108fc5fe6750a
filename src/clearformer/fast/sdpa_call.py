"""PyTorch's fused attention, as every fast path calls it: grouped keys and values included.

Under grouped-query attention keys and values have Hkv heads for H query heads. SDPA reads
each group's keys and values in place when told (``enable_gqa=True``, torch >= 2.5), so no
path repeats them in memory; the reference (:func:`clearformer.reference.scaled_dot_product`)
repeats them, to show every step as a tensor.

With dropout on the probabilities (training), SDPA on a CPU runs its math path, whose dropout
draws every probability's Bernoulli sample from PyTorch's generator on one thread. Inside
:func:`clearformer.runtime.counter_masks`, where the dropout kernel can take the rows, the same
math is written out here and the probabilities go through
:func:`clearformer.fast.counter_dropout.dropout` instead: the scores, the softmax and the
products are what SDPA's math path computes, only the mask's generator differs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .counter_dropout import counter_masks_serve, dropout


def sdpa(q: Tensor, k: Tensor, v: Tensor, **kwargs) -> Tensor:
    """``F.scaled_dot_product_attention(q, k, v, **kwargs)`` for q (..., H, Tq, Dh) and k, v
    (..., Hkv, Tk, Dh) with Hkv dividing H: query head h reads key/value head h // (H / Hkv)."""
    if kwargs.get("dropout_p", 0.0) > 0.0 and counter_masks_serve(q):
        return _written_out(q, k, v, **kwargs)
    if k.shape[-3] != q.shape[-3]:
        kwargs["enable_gqa"] = True
    return F.scaled_dot_product_attention(q, k, v, **kwargs)


def _written_out(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
) -> Tensor:
    """SDPA's math path with clearformer's dropout: softmax(q k^T * scale + mask) v, a
    boolean ``attn_mask`` True where a key takes part, a float one added to the scores,
    ``is_causal`` aligned top-left as SDPA's. A query with no key gets zeros (SDPA's safe
    softmax); the masked scores are the most negative finite value, so its gradient stays
    finite too."""
    if k.shape[-3] != q.shape[-3]:
        # (..., Hkv, Tk, Dh) -> (..., H, Tk, Dh): each group's keys and values per query head
        groups = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(groups, dim=-3), v.repeat_interleave(groups, dim=-3)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    tq, tk = q.shape[-2], k.shape[-2]
    lowest = torch.finfo(q.dtype).min
    if is_causal:
        attn_mask = torch.ones(tq, tk, dtype=torch.bool, device=q.device).tril()
    no_key = None
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            no_key = ~attn_mask.any(dim=-1, keepdim=True)  # (..., Tq | 1, 1)
            # Added to the scores in the product (a masked_fill would copy the scores forward
            # and their gradient backward): 0 where a key takes part, the lowest finite value
            # where not, so that a row without keys stays finite.
            attn_mask = torch.zeros(attn_mask.shape, dtype=q.dtype, device=q.device).masked_fill(
                ~attn_mask, lowest
            )
        else:
            no_key = torch.isneginf(attn_mask).all(dim=-1, keepdim=True)  # (..., Tq | 1, 1)
            attn_mask = attn_mask.to(q.dtype).clamp_min(lowest)
        if not bool(no_key.any()):
            no_key = None  # the usual case: nothing to zero
    batch = q.shape[:-2]
    # (..., H, T, Dh) -> (N, T, Dh), N the leading dimensions' product, for bmm's batches
    q3 = (q * scale).reshape(-1, tq, q.shape[-1])
    k3 = k.expand(*batch, tk, k.shape[-1]).reshape(-1, tk, k.shape[-1])
    v3 = v.expand(*batch, tk, v.shape[-1]).reshape(-1, tk, v.shape[-1])
    if attn_mask is None:
        scores = torch.bmm(q3, k3.transpose(1, 2))  # (N, Tq, Tk)
    else:
        # (..., Tq | 1, Tk) -> (N, Tq | 1, Tk): the mask's copy per head is small
        added = attn_mask.expand(*batch, attn_mask.shape[-2], tk).reshape(
            -1, attn_mask.shape[-2], tk
        )
        scores = torch.baddbmm(added, q3, k3.transpose(1, 2))  # (N, Tq, Tk)
    if scores.device.type == "cpu":
        # PyTorch's CPU softmax sums half-precision rows in float32 and rounds the result once:
        # a float32 copy of the scores and its way back would add four passes over them.
        weights = F.softmax(scores, dim=-1)
    else:
        # Softmax in float32 at least, as SDPA's math path for half-precision rows.
        weights = F.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32))
        weights = weights.to(q.dtype)
    if no_key is not None:
        rows = no_key.expand(*batch, tq, 1).reshape(-1, tq, 1)  # (N, Tq, 1)
        weights = weights.masked_fill(rows, 0.0)
    out = torch.bmm(dropout(weights, dropout_p), v3)  # (N, Tq, Dv)
    return out.view(*batch, tq, v.shape[-1])  # (N, Tq, Dv) -> (..., H, Tq, Dv)
