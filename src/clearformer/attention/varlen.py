"""Attention on packed rows: ``(N, H, Dh)`` real tokens of B sequences, split by ``cu_seqlens``.

Each sequence attends only to itself, so no padding enters any matrix product.

Implementations (``method``), all returning the same values:

``sequence``  one fused SDPA call per sequence (per run of consecutive equally long sequences)
              on a ``(G, H, L, Dh)`` strided view. The CPU flash kernel takes 4-D inputs only;
              a 3-D ``(H, L, Dh)`` view silently falls back to the unfused math kernel, which
              was 2x slower here.
``padded``    attention alone on a padded copy: one gather into ``(B, L_max)``, one masked SDPA
              call, one gather back. Linear layers still skip the padding; attention does not,
              but it makes one call per layer instead of B.
``bucket``    sequences sorted by length and grouped so that a group pads at most
              ``BUCKET_WASTE`` of its positions; one masked SDPA call per group. Fewer calls,
              but each group costs a gather and a scatter of its rows.
``nested``    a jagged nested tensor (``torch.nested``) through SDPA.
``flash``     ``flash_attn_varlen_func`` (CUDA, half precision, when the package is installed).

``auto`` takes ``flash`` when it can serve the call; otherwise ``sequence`` when the batch needs
at most ``MAX_SEQUENCE_CALLS`` calls (equal-length neighbours share one) or the calling thread
runs PyTorch single-threaded on CPU, and ``padded`` above.
Measured on the project's 2-core CPU (torch 2.13; 32 sequences of 16-256 tokens, 12 heads of
32; forward, one process), on an idle machine: ``sequence`` 16 ms, padded SDPA over the batch
21 ms plus the gathers, ``bucket`` 25-41 ms (the gathers cost more than the saved calls),
``nested`` 229 ms (its CPU SDPA unbinds and runs the math kernel). ``sequence`` is the
fastest there: a whole MiniLM-size stack on that batch took a median 614 ms per forward with
it and 704 ms with ``padded``. But each call is an OpenMP parallel
region, and when other processes compete for the cores every region can wait a scheduler
slice for a descheduled thread: on the shared machine the MiniLM stack's median forward took
4.1 s with ``sequence`` and 2.0-2.2 s with ``padded`` (BERT-base: 13.3 s and 9.7 s). ``auto``
takes the choice that cannot collapse. A single-threaded CPU caller (such as each of
``TextEncoder.encode(workers=2)``'s workers on two cores) has no parallel region to wait for,
and there
``sequence`` stays the fastest whatever the count: on 180 sequences of 15-30 tokens (16 runs)
17 ms against 38 ms for ``padded``, on 28 of 100-200 (27 runs) 25 ms against 37 ms.
``torch.nn.attention.varlen.varlen_attn`` has no CPU kernel in this build
(``NotImplementedError``). ``clearformer bench --sections kernels`` repeats the kernel
measurement.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..padding import PackedLayout
from .math import math_attention

VARLEN_METHODS = ("auto", "sequence", "padded", "bucket", "nested", "flash")
# A bucket pads at most this fraction of its positions (keys and queries both).
BUCKET_WASTE = 0.1
# Above this many attention calls per layer, ``auto`` takes ``padded`` over ``sequence``.
MAX_SEQUENCE_CALLS = 8


def _flash_attn_varlen():
    try:
        from flash_attn import flash_attn_varlen_func  # type: ignore[import-not-found]
    except ImportError:
        return None
    return flash_attn_varlen_func


def flash_available(q: Tensor) -> bool:
    """``flash_attn_varlen_func`` can serve rows like ``q`` (CUDA, fp16/bf16, package present)."""
    return (
        q.is_cuda
        and q.dtype in (torch.float16, torch.bfloat16)
        and _flash_attn_varlen() is not None
    )


def resolve_method(method: str, q: Tensor, layout: PackedLayout | None = None) -> str:
    """The implementation ``method`` runs on for rows like ``q`` in ``layout``."""
    if method not in VARLEN_METHODS:
        raise ValueError(f"method must be one of {VARLEN_METHODS}, got {method!r}")
    if method == "auto":
        if flash_available(q):
            return "flash"
        if q.device.type == "cpu" and torch.get_num_threads() == 1:
            # No parallel region, nothing to wait for: one call per run is the fastest at any
            # count (measured single-threaded, 16-32 runs: 1.3-2.3x faster than ``padded``).
            return "sequence"
        calls = len(equal_length_runs(layout.offsets)) if layout is not None else 1
        return "sequence" if calls <= MAX_SEQUENCE_CALLS else "padded"
    if method == "flash" and not flash_available(q):
        raise ValueError(
            "method='flash' needs CUDA tensors in float16/bfloat16 and the flash_attn package, "
            f"got device={q.device}, dtype={q.dtype}"
        )
    return method


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
) -> Tensor:
    """Self-attention within each packed sequence.

    Args:
        q, k: (N, H, Dh); v: (N, H, Dv); rows ordered as ``layout.offsets`` says.
        layout: where each sequence starts (see :class:`clearformer.padding.PackedLayout`).
        is_causal: token i of a sequence sees tokens j <= i of the same sequence.
        dropout_p: dropout on the attention probabilities.
        scale: score scale, default 1 / sqrt(Dh).
        reference: run the explicit ``math`` formula per sequence (for tests and explain).
        method: one of ``VARLEN_METHODS`` (see the module docstring).

    Returns:
        (N, H, Dv). Rows of an empty sequence do not exist, so nothing needs zeroing.
    """
    if reference:
        return _per_sequence(q, k, v, layout, is_causal, dropout_p, scale, reference=True)
    method = resolve_method(method, q, layout)
    if method == "flash":
        return _flash_attn_varlen()(
            q,
            k,
            v,
            layout.cu_seqlens,
            layout.cu_seqlens,
            layout.max_seqlen,
            layout.max_seqlen,
            dropout_p=dropout_p,
            softmax_scale=scale,
            causal=is_causal,
        )
    if method == "bucket":
        return _bucketed(q, k, v, layout, is_causal, dropout_p, scale)
    if method == "padded":
        return _padded(q, k, v, layout, is_causal, dropout_p, scale)
    if method == "nested":
        return _nested(q, k, v, layout, is_causal, dropout_p, scale)
    return _per_sequence(q, k, v, layout, is_causal, dropout_p, scale, reference=False)


def equal_length_runs(offsets: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """``(first row, sequences, length)`` for each run of consecutive, equally long, non-empty
    sequences. Such a run is one ``(G, L)`` slab of the packed rows: attention takes it in one
    call, through a view, with no mask and no copy."""
    runs: list[tuple[int, int, int]] = []
    for start, end in zip(offsets[:-1], offsets[1:], strict=True):
        length = end - start
        if length == 0:
            continue
        if runs and runs[-1][2] == length and runs[-1][0] + runs[-1][1] * length == start:
            first, count, _ = runs[-1]
            runs[-1] = (first, count + 1, length)
        else:
            runs.append((start, 1, length))
    return runs


def _per_sequence(q, k, v, layout, is_causal, dropout_p, scale, *, reference: bool) -> Tensor:
    H, Dv = v.shape[1], v.shape[2]
    runs = equal_length_runs(layout.offsets)
    if not runs:
        return v.new_zeros(0, H, Dv)
    # The runs tile the N rows in order. One split per tensor (not a slice per run): in backward
    # a split concatenates the pieces' gradients in one pass, where B slices would each fill and
    # add a zero (N, H, Dh) gradient, B times per layer.
    sizes = [count * length for _, count, length in runs]
    pieces = []
    for (_, count, length), qs, ks, vs in zip(
        runs, q.split(sizes), k.split(sizes), v.split(sizes), strict=True
    ):
        # (G*L, H, Dh) -> (G, L, H, Dh) -> (G, H, L, Dh): a strided view that the flash kernel
        # (4-D inputs only) reads without a copy.
        qs, ks, vs = (t.view(count, length, H, -1).transpose(1, 2) for t in (qs, ks, vs))
        if reference:
            out, _ = math_attention(
                qs, ks, vs, None, is_causal=is_causal, dropout_p=dropout_p, scale=scale
            )
        else:
            out = F.scaled_dot_product_attention(
                qs, ks, vs, dropout_p=dropout_p, is_causal=is_causal, scale=scale
            )
        # (G, H, L, Dv) -> (G, L, H, Dv) -> (G*L, H, Dv); a view for the flash kernel's output.
        pieces.append(out.transpose(1, 2).reshape(count * length, H, Dv))
    if len(pieces) == 1:
        return pieces[0]
    return torch.cat(pieces, dim=0)  # (N, H, Dv)


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


def _padded(q, k, v, layout, is_causal, dropout_p, scale) -> Tensor:
    N, H, Dv = v.shape
    B, L = layout.batch, max(layout.max_seqlen, 1)
    lengths = torch.tensor(layout.lengths, device=q.device)  # (B,)
    starts = torch.tensor(layout.offsets[:-1], device=q.device)  # (B,)
    steps = torch.arange(L, device=q.device)  # (L,)
    real = steps[None, :] < lengths[:, None]  # (B, L) True = real token
    # Padded slots read row 0 of the batch (finite values); their keys are masked out and
    # their outputs dropped. With no rows at all there is nothing to attend.
    if N == 0:
        return v.new_zeros(0, H, Dv)
    rows = torch.where(real, starts[:, None] + steps[None, :], 0).reshape(-1)  # (B*L,)
    qs, ks, vs = (
        t.index_select(0, rows).view(B, L, H, -1).transpose(1, 2) for t in (q, k, v)
    )  # (B, H, L, Dh)
    mask = real[:, None, None, :]  # (B, 1, 1, L) keys
    if is_causal:
        mask = mask & torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
    # An empty sequence's row has no key: let it attend everywhere (finite); it is dropped.
    mask = mask | ~real.any(dim=1)[:, None, None, None]
    out = F.scaled_dot_product_attention(
        qs, ks, vs, attn_mask=mask, dropout_p=dropout_p, scale=scale
    ).transpose(1, 2)  # (B, L, H, Dv)
    keep = real.reshape(-1).nonzero().flatten()  # (N,) positions of the real tokens
    return out.reshape(B * L, H, Dv).index_select(0, keep)  # (N, H, Dv)


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
