"""Attention through ``torch.nn.functional.scaled_dot_product_attention``.

PyTorch picks a fused kernel (flash attention on CPU and CUDA, memory-efficient attention on
CUDA) that never materialises the (Tq, Tk) score matrix, so memory stays linear in T. Where the
plan names clearformer's AVX-512 kernel (``avx512=True``: unmasked float32 or bfloat16
self-attention, or attention under a key-padding mask whose keys are one run per sequence, on a
CPU where ``auto`` takes it, :func:`clearformer.routes.padded_attention_route`), that kernel
runs instead, as the packed rows would; unmasked rows that are causal, grouped or local take
the flash kernel of their dtype (float32, or bfloat16 on an AVX512-BF16 CPU).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..fast import avx512
from ..fast.sdpa_call import sdpa
from ..masks import fold_causal, rows_with_key
from ..ran import note

_UNKNOWN = object()  # query_has_key not computed by the caller: work it out here


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
    query_has_key: Tensor | None | object = _UNKNOWN,
    bias: Tensor | None = None,
    avx512: bool = False,
    key_runs: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor, None]:
    """Same contract as :func:`clearformer.kernels.math.math_attention`, without weights.

    Args:
        q: (B, H, Tq, Dh), k: (B, Hkv, Tk, Dh), v: (B, Hkv, Tk, Dv) (Hkv divides H: grouped
        keys and values are read in place), mask broadcastable to (B, H, Tq, Tk) with True =
        takes part.
        query_has_key: which query rows have a key, (B, H|1, Tq|1, 1) bool, or None when every
            row has one; a forward plan computes it once for all layers. Left out, it is
            computed here.
        bias: float, broadcastable to (B, H, Tq, Tk), added to the scores; or None.
        avx512: the plan names clearformer's AVX-512 kernel for this call: unmasked, or with
            ``key_runs`` (first real key, key count) per sequence under a key-padding mask.
    """
    if need_weights:
        raise ValueError(
            "need_weights=True: the 'sdpa' backend cannot return attention weights; "
            "use backend='math' (or 'auto', which picks 'math' when weights are requested)"
        )
    tq, tk = q.shape[-2], k.shape[-2]
    if avx512:
        out = _avx512(q, k, v, key_runs, scale, is_causal)
        if out is not None:
            note("attention", "avx512")
            return out, None
    note("attention", "sdpa")
    if bias is not None:
        return _with_bias(q, k, v, mask, bias, is_causal, dropout_p, scale, query_has_key), None
    # SDPA's own is_causal is top-left aligned; it equals ours only when Tq == Tk.
    if mask is None and (not is_causal or tq == tk):
        out = sdpa(q, k, v, dropout_p=dropout_p, is_causal=is_causal, scale=scale)
        return out, None
    if is_causal:
        mask = fold_causal(mask, tq, tk, q.device)
    if query_has_key is _UNKNOWN:
        query_has_key = rows_with_key(mask, q.device)
    if query_has_key is None:
        # The usual case, every query has a key: no mask widening, no output zeroing.
        out = sdpa(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale)
        return out, None
    # A query with no key to attend must give zeros, with finite gradients, on every build and
    # kernel: let such rows attend everywhere (finite, harmless) and zero their output after.
    out = sdpa(
        q, k, v, attn_mask=mask | ~query_has_key, dropout_p=dropout_p, scale=scale
    )  # (B, H, Tq, Dv)
    # torch.where keeps the kernel's (B, Tq, H, Dv) memory order, so the head merge that follows
    # stays a view (masked_fill's clone made it contiguous in (B, H, Tq, Dv), costing a copy).
    return torch.where(query_has_key, out, 0.0), None


def _scale(scale: float | None, head_dim: int) -> float:
    return head_dim**-0.5 if scale is None else scale  # SDPA's default


def _avx512(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    key_runs: tuple[Tensor, Tensor] | None,
    scale: float | None,
    is_causal: bool,
) -> Tensor | None:
    """Self-attention through clearformer's AVX-512 kernel, as the plan names it: unmasked
    (every sequence as long as the next), or every query of sequence b over its keys
    ``first[b] : first[b] + count[b]`` (``key_runs``); None where the rows are not laid out as
    the kernel reads them (its strides), which PyTorch's kernel then takes. Unmasked rows the
    AVX-512 kernel cannot read (causal, grouped, queries and keys apart from the values) take
    the flash kernel of their dtype."""
    B, H, T, Dh = q.shape
    if T == 0 or k.shape[-2] != T:  # no rows, or not self-attention: PyTorch's kernel
        return None
    flash = key_runs is None
    if is_causal or k.shape[1] != H:  # the AVX-512 kernel's rows are neither
        return _flash(q, k, v, scale, is_causal) if flash else None
    if key_runs is not None:
        rows = [t.transpose(1, 2) for t in (q, k, v)]  # (B, T, H, Dh) views
        if not avx512.serves(*rows):
            return None
        out = avx512.padded_attention(*rows, *key_runs, _scale(scale, Dh))
        return out.transpose(1, 2)  # (B, H, T, Dh), in (B, T, H, Dh) order
    try:  # (B, H, T, Dh) -> (B * T, H, Dh): a view of the projection's rows, no copy
        rows = [t.transpose(1, 2).view(B * T, H, Dh) for t in (q, k, v)]
    except RuntimeError:
        rows = None
    if rows is None or not avx512.serves(*rows):
        # Queries and keys apart from the values (their strides differ; the plan, told so,
        # asked the flash kernel's verdict): unmasked rows still have the flash kernel.
        return _flash(q, k, v, scale, is_causal) if flash else None
    bounds = torch.arange(0, B * T + 1, T, dtype=torch.int64)  # (B + 1,)
    out = avx512.attention(*rows, bounds, _scale(scale, Dh))  # (B*T, H, Dh)
    return out.view(B, T, H, Dh).transpose(1, 2)  # (B, H, T, Dh), in (B, T, H, Dh) order


def local_flash_attention(
    q: Tensor, k: Tensor, v: Tensor, window: int, *, is_causal: bool, scale: float | None
) -> Tensor | None:
    """Unmasked local self-attention (token i sees tokens j with |i - j| <= ``window``) on
    (B, H|Hkv, T, Dh) float32 or bfloat16 rows through the flash kernel of their dtype, as the
    plan names it; None where the kernel cannot read them (PyTorch's routes then take the
    call)."""
    if q.shape[-2] == 0 or k.shape[-2] != q.shape[-2]:
        return None
    return _flash(q, k, v, scale, is_causal, window)


def _flash(
    q: Tensor, k: Tensor, v: Tensor, scale: float | None, is_causal: bool, window=None
) -> Tensor | None:
    """Unmasked rows through the flash kernel of their dtype (those the AVX-512 kernel cannot
    read as they are); None where it cannot read them either."""
    B, H, T, Dh = q.shape
    # (B, H|Hkv, T, Dh) -> (B * T, H|Hkv, Dh): views of the projection's rows where they are
    # laid out so, else copies (one pass over the rows, against T passes of attention).
    if v.shape[-1] != Dh:
        return None  # values wider or narrower than the keys: PyTorch's kernel
    rows = [t.transpose(1, 2).reshape(B * T, t.shape[1], Dh) for t in (q, k, v)]
    if not avx512.flash_serves(*rows):
        return None
    bounds = torch.arange(0, B * T + 1, T, dtype=torch.int64)  # (B + 1,)
    scaled = _scale(scale, Dh)
    out = avx512.flash_attention(*rows, bounds, scaled, is_causal, window)  # (B*T, H, Dh)
    return out.view(B, T, H, Dh).transpose(1, 2)  # (B, H, T, Dh), in (B, T, H, Dh) order


def _with_bias(q, k, v, mask, bias, is_causal, dropout_p, scale, query_has_key) -> Tensor:
    """SDPA with an additive float mask: the bias, and -inf where ``mask`` forbids."""
    tq, tk = q.shape[-2], k.shape[-2]
    if is_causal:
        mask = fold_causal(mask, tq, tk, q.device)
    if query_has_key is _UNKNOWN:
        query_has_key = rows_with_key(mask, q.device)
    scores_bias = bias.to(q.dtype)
    if mask is not None:
        # A query with no key attends everywhere (finite) and is zeroed after, as above.
        allowed = mask if query_has_key is None else mask | ~query_has_key
        scores_bias = scores_bias.masked_fill(~allowed, float("-inf"))  # (B|1, H, Tq, Tk)
    out = sdpa(q, k, v, attn_mask=scores_bias, dropout_p=dropout_p, scale=scale)
    return out if query_has_key is None else torch.where(query_has_key, out, 0.0)
