"""Two packed-attention methods kept for the benchmark only: both lost to the kernel's own.

``bucket``  sequences sorted by length and grouped so that a group pads at most
            ``BUCKET_WASTE`` of its positions; one masked SDPA call per group. Fewer calls than
            ``sequence``, but each group costs a gather and a scatter of its rows.
``nested``  a jagged nested tensor (``torch.nested``) through SDPA; on CPU its SDPA unbinds the
            batch and runs the unfused math kernel.

``clearformer bench --sections kernels`` times them against the methods of
:mod:`clearformer.fast.varlen`; the figures are in ``docs/performance.md``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..padding import PackedLayout

__all__ = ["BENCH_METHODS", "BUCKET_WASTE", "bench_varlen_attention", "length_buckets"]

# A bucket pads at most this fraction of its positions (keys and queries both).
BUCKET_WASTE = 0.1
BENCH_METHODS = ("bucket", "nested")


def bench_varlen_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    layout: PackedLayout,
    *,
    method: str,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
) -> Tensor:
    """Same contract as :func:`clearformer.fast.varlen.varlen_attention`: (N, H, Dv)."""
    if method == "bucket":
        return _bucketed(q, k, v, layout, is_causal, dropout_p, scale)
    if method == "nested":
        return _nested(q, k, v, layout, is_causal, dropout_p, scale)
    raise ValueError(f"method must be one of {BENCH_METHODS}, got {method!r}")


def length_buckets(lengths: list[int], waste: float = BUCKET_WASTE) -> list[list[int]]:
    """Group sequence indices by length so that each group pads at most ``waste`` of its slots.

    Sequences are taken shortest first; a group closes when adding the next would push its
    padded size ``len(group) * longest`` above ``(1 + waste) * real tokens``. Empty sequences
    are left out.
    """
    order = sorted((b for b, n in enumerate(lengths) if n > 0), key=lambda b: lengths[b])
    groups: list[list[int]] = []
    current: list[int] = []
    real = 0
    for b in order:
        n = lengths[b]
        if current and n * (len(current) + 1) > (1.0 + waste) * (real + n):
            groups.append(current)
            current, real = [], 0
        current.append(b)
        real += n
    if current:
        groups.append(current)
    return groups


def _bucketed(q, k, v, layout, is_causal, dropout_p, scale) -> Tensor:
    N, H, Dv = v.shape
    lengths = layout.lengths
    out = v.new_empty(N, H, Dv)
    for group in length_buckets(lengths):
        longest = max(lengths[b] for b in group)
        steps = torch.arange(longest, device=q.device)  # (L,)
        starts = torch.tensor([layout.offsets[b] for b in group], device=q.device)
        sizes = torch.tensor([lengths[b] for b in group], device=q.device)
        real = steps[None, :] < sizes[:, None]  # (G, L) True = real token
        # Padded slots point at row 0 (any real row): finite values, masked out below.
        rows = torch.where(real, starts[:, None] + steps[None, :], 0).reshape(-1)  # (G*L,)
        G = len(group)
        qs, ks, vs = (
            t.index_select(0, rows).view(G, longest, H, -1).transpose(1, 2) for t in (q, k, v)
        )  # (G, H, L, Dh)
        if bool(real.all()):
            mask = None
        else:
            mask = real[:, None, None, :]  # (G, 1, 1, L) keys
            if is_causal:
                mask = mask & torch.ones(longest, longest, dtype=torch.bool, device=q.device).tril()
        o = F.scaled_dot_product_attention(
            qs,
            ks,
            vs,
            attn_mask=mask,
            dropout_p=dropout_p,
            is_causal=is_causal and mask is None,
            scale=scale,
        ).transpose(1, 2)  # (G, L, H, Dv)
        keep = real.reshape(-1)
        out = out.index_copy(0, rows[keep], o.reshape(G * longest, H, Dv)[keep])
    return out


def _nested(q, k, v, layout, is_causal, dropout_p, scale) -> Tensor:
    if is_causal:
        raise ValueError("method='nested' does not support is_causal=True; use 'sequence'")
    offsets = layout.cu_seqlens.to(device=q.device, dtype=torch.int64)
    # (N, H, Dh) -> jagged (B, j, H, Dh) -> (B, H, j, Dh); jagged SDPA needs contiguous values.
    qn, kn, vn = (
        torch.nested.nested_tensor_from_jagged(t.contiguous(), offsets=offsets).transpose(1, 2)
        for t in (q, k, v)
    )
    out = F.scaled_dot_product_attention(
        qn, kn, vn, dropout_p=dropout_p, is_causal=is_causal, scale=scale
    )
    return out.transpose(1, 2).values()  # (N, H, Dv)
