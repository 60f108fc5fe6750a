"""PyTorch's fused attention, as every fast path calls it: grouped keys and values included.

Under grouped-query attention keys and values have Hkv heads for H query heads. SDPA reads
each group's keys and values in place when told (``enable_gqa=True``, torch >= 2.5), so no
path repeats them in memory; the reference (:func:`clearformer.reference.scaled_dot_product`)
repeats them, to show every step as a tensor.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def sdpa(q: Tensor, k: Tensor, v: Tensor, **kwargs) -> Tensor:
    """``F.scaled_dot_product_attention(q, k, v, **kwargs)`` for q (..., H, Tq, Dh) and k, v
    (..., Hkv, Tk, Dh) with Hkv dividing H: query head h reads key/value head h // (H / Hkv)."""
    if k.shape[-3] != q.shape[-3]:
        kwargs["enable_gqa"] = True
    return F.scaled_dot_product_attention(q, k, v, **kwargs)
