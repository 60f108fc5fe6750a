"""The ``math`` kernel: the reference attention (explicit scores, softmax and weighted sum,
:func:`clearformer.reference.scaled_dot_product`) behind the kernels' signature.

It is the slowest backend and the only one that can return the attention weights; every other
backend is tested against it.
"""

from __future__ import annotations

from torch import Tensor

from ..masks import fold_causal
from ..reference import scaled_dot_product


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
    if is_causal:
        mask = fold_causal(mask, q.shape[-2], k.shape[-2], q.device)
    out, weights = scaled_dot_product(q, k, v, mask, bias=bias, dropout_p=dropout_p, scale=scale)
    return out, (weights if need_weights else None)
