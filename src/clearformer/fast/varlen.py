"""Attention on packed rows: ``(N, H, Dh)`` real tokens of B sequences, split by ``cu_seqlens``.

Each sequence attends only to itself, so no padding enters any matrix product.

Implementations (``method``), all returning the same values:

``sequence``  one fused SDPA call per run of consecutive, equally long sequences, on a
              ``(G, H, L, Dh)`` strided view. The CPU flash kernel takes 4-D inputs only; a 3-D
              ``(H, L, Dh)`` view silently falls back to the slower unfused math kernel.
``padded``    attention alone on a padded copy: one gather into ``(B, L_max)``, one masked SDPA
              call, one gather back. Linear layers still skip the padding; attention does not,
              but it makes one call per layer instead of one per sequence.
``threads``   ``sequence``'s calls, the runs grouped over the intra-op threads, each group on a
              single-threaded worker (:mod:`.varlen_threads`): no parallel region to wait in.
``flash``     ``flash_attn_varlen_func`` (CUDA, half precision, when the package is installed).
``avx512``    clearformer's own C++ kernels for AVX-512 CPUs (:mod:`.avx512`, built on request):
              float32 (bfloat16 rows widened for it), plain bidirectional attention without
              gradients; bfloat16 rows that are causal, local or have grouped keys go to its
              bfloat16 flash kernel on CPUs with AVX512-BF16; calls neither can serve (a
              bias, dropout) run as ``auto`` would without it.

Grouped-query attention (keys and values with Hkv < H heads): ``sequence``, ``padded`` and
``threads`` hand the grouped rows to SDPA with ``enable_gqa`` and ``flash`` to
``flash_attn_varlen_func``, which both read each group's keys in place; the AVX-512 kernel reads
one key/value head per query head, so it declines grouped float32 calls rather than repeat them,
and the bfloat16 flash kernel reads each group's keys once for all its query heads.

Which method a layer takes is the plan's choice (:func:`clearformer.routes.varlen_method`,
with its rules and their measurements); :func:`attend` runs the method it is given and decides
nothing. Two more methods that lost (``bucket``, ``nested``) live with the benchmark, in
:mod:`clearformer.bench.varlen_methods`."""

from __future__ import annotations

import torch
from torch import Tensor

from ..machine import flash_attn_varlen
from ..masks import band_mask, fold_causal
from ..padding import equal_length_runs
from ..ran import note
from ..reference import scaled_dot_product as reference_attention
from . import avx512
from .local import banded_attention, use_banded
from .sdpa_call import sdpa
from .varlen_threads import threaded_attention

__all__ = ["RUN_METHODS", "attend", "equal_length_runs"]

# The methods :func:`attend` runs (``auto`` is the routes' to resolve).
RUN_METHODS = ("sequence", "padded", "threads", "flash", "avx512")


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    layout,
    method: str,
    *,
    is_causal: bool = False,
    dropout_p: float = 0.0,
    scale: float | None = None,
    reference: bool = False,
    window: int | None = None,
    bias: Tensor | None = None,
) -> Tensor:
    """Self-attention within each packed sequence, by ``method`` (one of :data:`RUN_METHODS`,
    chosen by the plan; ``reference`` runs the explicit ``math`` formula per sequence instead).

    Args:
        q: (N, H, Dh); k: (N, Hkv, Dh); v: (N, Hkv, Dv), Hkv dividing H (grouped-query
            attention); rows ordered as ``layout.offsets`` says.
        layout: where each sequence starts (see :class:`clearformer.padding.PackedLayout`).
        is_causal: token i of a sequence sees tokens j <= i of the same sequence.
        dropout_p: dropout on the attention probabilities.
        scale: score scale, default 1 / sqrt(Dh).
        window: local attention: token i sees tokens j of its sequence with |i - j| <= window;
            None = the whole sequence.
        bias: (H, L, L) float added to the scores of every sequence (its top-left corner, for
            a shorter one): a relative position bias. None: no bias.

    Returns:
        (N, H, Dv). Rows of an empty sequence do not exist, so nothing needs zeroing.
    """
    if window is not None and bias is not None:
        raise ValueError("a relative position bias with a local window is not supported")
    if layout.num_tokens == 0:  # no rows: nothing to attend, whatever the method
        return v.new_zeros(0, q.shape[1], v.shape[2])
    if reference:
        note("attention", "math")
        return _per_sequence(
            q, k, v, layout, is_causal, dropout_p, scale, window, bias, reference=True
        )
    if method not in RUN_METHODS:
        raise ValueError(f"method must be one of {RUN_METHODS} here, got {method!r}")
    note("attention", method)
    if method == "avx512":
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        if not is_causal and window is None and avx512.serves(q, k, v):
            return avx512.attention(q, k, v, layout.cu_seqlens, scale)
        # Rows the AVX-512 kernel cannot read (causal, grouped keys and values, queries and
        # keys apart from the values): the flash kernel of their dtype.
        if bias is None and dropout_p == 0.0 and avx512.flash_serves(q, k, v):
            return avx512.flash_attention(q, k, v, layout.cu_seqlens, scale, is_causal, window)
        raise ValueError(
            "method='avx512' cannot read these rows: it needs the library loaded and float32 "
            "or bfloat16 CPU rows of one shape and stride, heads of 16k, no gradients, or "
            "(causal, grouped) float32 rows, or bfloat16 ones on an AVX512-BF16 CPU, with "
            "heads of 32k"
        )
    if method == "flash":
        return flash_attn_varlen()(
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
    if method == "padded":
        return _padded(q, k, v, layout, is_causal, dropout_p, scale, window, bias)
    if method == "threads":

        def attend_runs(qs, ks, vs, runs):
            return _per_sequence(
                qs,
                ks,
                vs,
                layout,
                is_causal,
                dropout_p,
                scale,
                window,
                bias,
                reference=False,
                runs=runs,
                join=False,
            )

        return threaded_attention(q, k, v, layout, is_causal, scale, window, bias, attend_runs)
    return _per_sequence(
        q, k, v, layout, is_causal, dropout_p, scale, window, bias, reference=False
    )


def _per_sequence(
    q, k, v, layout, is_causal, dropout_p, scale, window, bias, *, reference, runs=None, join=True
) -> Tensor | list[Tensor]:
    """One fused call per run of ``runs`` (default: all of the layout's), which tile the rows of
    ``q``, ``k``, ``v`` in order. ``join=False`` returns the runs' outputs unconcatenated (the
    ``threads`` method joins every worker's pieces in one concatenation)."""
    H, Dv = q.shape[1], v.shape[2]  # keys and values may have fewer heads (grouped)
    runs = layout.runs if runs is None else runs
    if not runs:
        return v.new_zeros(0, H, Dv) if join else []
    # The runs tile the N rows in order. One split per tensor (not a slice per run): in backward
    # a split concatenates the pieces' gradients in one pass, where B slices would each fill and
    # add a zero (N, H, Dh) gradient, B times per layer.
    sizes = [count * length for _, count, length in runs]
    pieces = []
    for (_, count, length), qs, ks, vs in zip(
        runs, q.split(sizes), k.split(sizes), v.split(sizes), strict=True
    ):
        # (G*L, heads, Dh) -> (G, L, heads, Dh) -> (G, heads, L, Dh): a strided view that the
        # flash kernel (4-D inputs only) reads without a copy.
        qs, ks, vs = (t.view(count, length, t.shape[1], -1).transpose(1, 2) for t in (qs, ks, vs))
        # A window inside one sequence: every query keeps at least itself, so no row is empty.
        needs_band = window is not None and window < length - 1
        if needs_band and not reference and use_banded(length, window):
            out = banded_attention(
                qs, ks, vs, window, is_causal=is_causal, dropout_p=dropout_p, scale=scale
            )
            pieces.append(out.transpose(1, 2).reshape(count * length, H, Dv))
            continue
        band = band_mask(length, window, q.device) if needs_band else None
        corner = None if bias is None else bias[:, :length, :length]  # (H, L, L)
        if reference:
            allowed = fold_causal(band, length, length, q.device) if is_causal else band
            out, _ = reference_attention(
                qs, ks, vs, allowed, bias=corner, dropout_p=dropout_p, scale=scale
            )
        elif corner is not None:
            allowed = band
            if is_causal:
                allowed = fold_causal(allowed, length, length, q.device)
            additive = corner.to(q.dtype)  # (H, L, L), broadcast over the G sequences
            if allowed is not None:
                additive = additive.masked_fill(~allowed, float("-inf"))  # keeps the diagonal
            out = sdpa(qs, ks, vs, attn_mask=additive, dropout_p=dropout_p, scale=scale)
        elif band is not None:
            if is_causal:
                band = fold_causal(band, length, length, q.device)
            out = sdpa(qs, ks, vs, attn_mask=band, dropout_p=dropout_p, scale=scale)
        else:
            out = sdpa(qs, ks, vs, dropout_p=dropout_p, is_causal=is_causal, scale=scale)
        # (G, H, L, Dv) -> (G, L, H, Dv) -> (G*L, H, Dv); a view for the flash kernel's output.
        pieces.append(out.transpose(1, 2).reshape(count * length, H, Dv))
    if not join:
        return pieces
    if len(pieces) == 1:
        return pieces[0]
    return torch.cat(pieces, dim=0)  # (N, H, Dv)


def _padded(q, k, v, layout, is_causal, dropout_p, scale, window, bias) -> Tensor:
    """The sequences padded to a common length, in groups whose lengths are within a factor
    of 2 of their longest (:func:`length_groups`): one group is one padded call over every
    sequence; several keep short sequences from being padded to the batch's longest (a
    training batch of short queries and long documents)."""
    N, H, Dv = v.shape[0], q.shape[1], v.shape[2]
    if N == 0:  # no rows at all: nothing to attend
        return v.new_zeros(0, H, Dv)
    groups = length_groups(layout.lengths)
    if len(groups) == 1:
        return _padded_group(
            q, k, v, layout.lengths, layout.offsets[:-1], is_causal, dropout_p, scale, window, bias
        )
    pieces = []
    for members in groups:
        lengths = [layout.lengths[b] for b in members]
        starts = [layout.offsets[b] for b in members]
        pieces.append(
            _padded_group(q, k, v, lengths, starts, is_causal, dropout_p, scale, window, bias)
        )
    # The row each piece's row came from: sequence b's rows are offsets[b] + 0 ... length - 1.
    members = torch.tensor([b for group in groups for b in group])  # (B,) in the groups' order
    lengths = torch.tensor(layout.lengths)[members]  # (B,)
    first = torch.tensor(layout.offsets[:-1])[members]  # (B,) each sequence's first row
    before = torch.cumsum(lengths, 0) - lengths  # (B,) rows of the pieces before it
    order = torch.arange(N) + torch.repeat_interleave(first - before, lengths)  # (N,)
    joined = torch.cat(pieces)  # (N, H, Dv) in the groups' order
    # (N, H, Dv), rows in order
    return joined.new_zeros(N, H, Dv).index_copy(0, order.to(q.device), joined)


def length_groups(lengths: list[int]) -> list[list[int]]:
    """The sequences (indices into ``lengths``) in groups, longest first: a group takes the
    next longest sequence while it is at least half as long as the group's first, so no
    sequence is padded to more than twice its length (at most 4x its scores)."""
    order = sorted(range(len(lengths)), key=lambda b: -lengths[b])
    groups: list[list[int]] = []
    for b in order:
        if groups and 2 * lengths[b] >= lengths[groups[-1][0]]:
            groups[-1].append(b)
        else:
            groups.append([b])
    return groups


def _padded_group(q, k, v, lengths, starts, is_causal, dropout_p, scale, window, bias) -> Tensor:
    """The rows of the sequences with these ``lengths`` and first rows ``starts``, padded to
    their longest: (their tokens, H, Dv), sequence by sequence."""
    H, Dv = q.shape[1], v.shape[2]
    B, L = len(lengths), max(max(lengths), 1)
    starts = torch.tensor(starts, device=q.device)  # (B,)
    lengths = torch.tensor(lengths, device=q.device)  # (B,)
    steps = torch.arange(L, device=q.device)  # (L,)
    real = steps[None, :] < lengths[:, None]  # (B, L) True = real token
    # Padded slots read row 0 of the batch (finite values); their keys are masked out and
    # their outputs dropped.
    rows = torch.where(real, starts[:, None] + steps[None, :], 0).reshape(-1)  # (B*L,)
    qs, ks, vs = (
        t.index_select(0, rows).view(B, L, t.shape[1], -1).transpose(1, 2) for t in (q, k, v)
    )  # (B, heads, L, Dh)
    mask = real[:, None, None, :]  # (B, 1, 1, L) keys
    if is_causal:
        mask = mask & torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
    if window is not None and use_banded(L, window):
        # Long sequences: slab by slab, never a (B, 1, L, L) band (nor SDPA's float bias).
        out = banded_attention(
            qs,
            ks,
            vs,
            window,
            real[:, None, None, :],
            is_causal=is_causal,
            dropout_p=dropout_p,
            scale=scale,
        ).transpose(1, 2)  # (B, L, H, Dv)
        keep = real.reshape(-1).nonzero().flatten()  # (N,)
        return out.reshape(B * L, H, Dv).index_select(0, keep)
    if window is not None:
        mask = mask & band_mask(L, window, q.device)
    # A padded slot with no key in reach (an empty sequence's, or one beyond the window of
    # every real token) would give NaN: let it attend everywhere (finite); it is dropped.
    mask = mask | ~mask.any(dim=-1, keepdim=True)
    attn_mask = mask
    if bias is not None:
        # (1, H, L, L) bias, -inf where the (B, 1, L|1, L) mask forbids: (B, H, L, L).
        attn_mask = bias[None, :, :L, :L].to(q.dtype).masked_fill(~mask, float("-inf"))
    out = sdpa(qs, ks, vs, attn_mask=attn_mask, dropout_p=dropout_p, scale=scale).transpose(
        1, 2
    )  # (B, L, H, Dv)
    keep = real.reshape(-1).nonzero().flatten()  # (N,) positions of the real tokens
    return out.reshape(B * L, H, Dv).index_select(0, keep)  # (N, H, Dv)
