"""Local (sliding-window) attention whose memory grows with T * window, not T * T.

A query i sees keys j with |i - j| <= window. Queries are taken in blocks of ``block`` rows;
a block [s, e) can only reach keys [s - window, e + window), so each block is one fused SDPA
call on a (block, block + 2 * window) slab with its own small band mask. No (T, T) tensor is
ever made: a ModernBERT local layer at T = 8192 with window 64 holds slabs of 128 x 256
instead of one 8192 x 8192 mask (and SDPA's float bias of the same size).

Short sequences (at most ``BANDED_MIN_LENGTH``) take one call with the whole band mask
instead, which is faster there.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .sdpa_call import sdpa

# Below this length one call with the whole (T, T) band is cheaper than slabs.
BANDED_MIN_LENGTH = 512


def use_banded(length: int, window: int) -> bool:
    """Whether a sequence of ``length`` with this half-window runs slab by slab."""
    return length > max(BANDED_MIN_LENGTH, 4 * (2 * window + 1))


def banded_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    window: int,
    key_mask: Tensor | None = None,
    *,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
    block: int | None = None,
) -> Tensor:
    """Attention within a window, slab by slab.

    Args:
        q: (B, H, T, Dh); k: (B, Hkv, T, Dh); v: (B, Hkv, T, Dv) (Hkv divides H).
        window: query i sees keys j with |i - j| <= window (and j <= i when ``is_causal``).
        key_mask: (B, 1|H, 1, T) bool, True = the key takes part; None = every key does.
        block: queries per slab; default max(window, 64).

    Returns:
        (B, H, T, Dv); a query with no key in reach (a padded position far from every real
        token) gives zeros.
    """
    T = q.shape[-2]
    block = max(window, 64) if block is None else block
    # One output buffer, each slab written into its rows: no list of pieces and no
    # concatenation, which would hold the output twice. Autograd records the slice writes.
    result = v.new_empty(*q.shape[:-1], v.shape[-1])  # (B, H, T, Dv)
    for start in range(0, T, block):
        end = min(T, start + block)
        first, last = max(0, start - window), min(T, end + window)
        rows = torch.arange(start, end, device=q.device)[:, None]  # (C, 1)
        cols = torch.arange(first, last, device=q.device)[None, :]  # (1, K)
        allowed = (rows - cols).abs() <= window  # (C, K)
        if is_causal:
            allowed = allowed & (cols <= rows)
        allowed = allowed[None, None]  # (1, 1, C, K)
        if key_mask is not None:
            allowed = allowed & key_mask[..., first:last]  # (B, 1|H, C, K)
        has_key = allowed.any(dim=-1, keepdim=True)  # (B|1, 1|H, C, 1)
        out = sdpa(
            q[:, :, start:end],
            k[:, :, first:last],
            v[:, :, first:last],
            attn_mask=allowed | ~has_key,  # rows with no key attend anywhere (finite), zeroed
            dropout_p=dropout_p,
            scale=scale,
        )  # (B, H, C, Dv)
        result[:, :, start:end] = torch.where(has_key, out, 0.0)
    return result
