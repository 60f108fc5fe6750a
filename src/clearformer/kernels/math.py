"""The reference attention: explicit scores, softmax and weighted sum.

It is the slowest backend and the only one that can return the attention weights; every other
backend is tested against it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..masks import fold_causal
from ..tracing import record


def math_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    *,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
    need_weights: bool = False,
    bias: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Scaled dot-product attention, written out.

    Args:
        q: (B, H, Tq, Dh) queries. k: (B, H, Tk, Dh) keys. v: (B, H, Tk, Dv) values.
        mask: bool, broadcastable to (B, H, Tq, Tk), True = takes part; or None.
        is_causal: add the bottom-right aligned causal constraint.
        dropout_p: dropout on the attention probabilities (pass 0.0 in eval).
        scale: score scale, default 1 / sqrt(Dh).
        need_weights: also return the attention probabilities (before dropout).
        bias: float, broadcastable to (B, H, Tq, Tk), added to the scores (a relative position
            bias); or None.

    Returns:
        out (B, H, Tq, Dv) and weights (B, H, Tq, Tk) or None. A query with no key to attend
        gets weights 0 and output 0.
    """
    tq, tk = q.shape[-2], k.shape[-2]
    if is_causal:
        mask = fold_causal(mask, tq, tk, q.device)
    # Dividing by sqrt(Dh) keeps the scores' variance near 1 whatever the head width: the dot
    # product of two random Dh-vectors has variance Dh, and a softmax of large scores saturates.
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    # Scale q before the product: in float16 the unscaled dot products can overflow.
    scores = torch.matmul(q * scale, k.transpose(-2, -1))  # (B, H, Tq, Tk)
    record("attn.scores", scores)
    if bias is not None:  # a relative position bias: what the scores add by distance alone
        scores = scores + bias.to(scores.dtype)
        record("attn.biased_scores", scores)
    if mask is not None:
        # The most negative finite value, not -inf: a row with every key masked stays finite
        # (uniform) through the softmax and is zeroed just below, so neither the output nor
        # the gradient can become NaN. finfo(dtype).min is safe in every dtype.
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        record("attn.masked_scores", scores, mask=mask)
    # Softmax in float32 at least: half-precision exponentials lose the small weights.
    weights = F.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32))
    weights = weights.to(q.dtype)
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)  # masked keys get exactly 0
    record("attn.weights", weights)
    probs = F.dropout(weights, p=dropout_p) if dropout_p > 0.0 else weights
    out = torch.matmul(probs, v)  # (B, H, Tq, Dv)
    record("attn.context", out)
    return out, (weights if need_weights else None)
