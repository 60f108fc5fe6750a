"""Pooling, the sentence-embedding head: one vector per sequence from its real tokens, as
sentence-transformers' ``Pooling`` module computes it."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["POOLING_MODES", "pool"]

POOLING_MODES = ("mean", "cls", "max", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")


def pool(hidden: Tensor, attention_mask: Tensor, mode: str = "mean", *, skip: int = 0) -> Tensor:
    """Pool token states into one vector per sequence.

    Args:
        hidden: (B, T, D) token states.
        attention_mask: (B, T) bool, True = real token.
        mode: ``mean`` (average of real tokens), ``cls`` (first token), ``max`` (per feature),
            ``mean_sqrt_len_tokens`` (their sum over the square root of their count, so
            longer texts get longer vectors), ``weightedmean`` (a mean with weights 1, 2, ..., T
            by position from the row's first real token: in a decoder, later tokens have seen
            more of the text), ``lasttoken`` (the last real token: decoder-style embedders,
            whose last token has seen the whole text).
        skip: leading tokens of each row's real ones to leave out (a prompt's, for a pooling
            with ``include_prompt: false``), counted from the row's first real token whatever
            the padding side; ``cls`` then takes the first token after them, as
            sentence-transformers does.

    Returns:
        (B, D); a row without tokens pools to zeros (``max``: -inf). What a padded position
        holds (NaN included) never reaches the result. ``cls`` is the row's first real token,
        on either padding side.
    """
    if mode not in POOLING_MODES:
        raise ValueError(f"mode must be one of {POOLING_MODES}, got {mode!r}")
    if hidden.dim() != 3:
        raise ValueError(f"hidden must be (B, T, D), got shape {tuple(hidden.shape)}")
    if tuple(attention_mask.shape) != tuple(hidden.shape[:2]):
        raise ValueError(
            f"attention_mask must have shape (B, T) = {tuple(hidden.shape[:2])}, "
            f"got {tuple(attention_mask.shape)}"
        )
    if attention_mask.dtype != torch.bool:
        raise TypeError(f"attention_mask must be a bool tensor, got dtype {attention_mask.dtype}")
    if not isinstance(skip, int) or isinstance(skip, bool) or skip < 0:
        raise ValueError(f"skip must be an int >= 0, got {skip!r}")
    B, T, D = hidden.shape
    given = attention_mask  # before a prompt is left out: weightedmean counts from here
    if skip and T:
        # The prompt is the first `skip` of each row's real tokens: after its left padding.
        first = attention_mask.int().argmax(dim=1, keepdim=True)  # (B, 1)
        positions = torch.arange(T, device=hidden.device)  # (T,)
        attention_mask = attention_mask & (positions >= first + skip)  # (B, T)
    keep = attention_mask.unsqueeze(-1)  # (B, T, 1)
    if mode == "max":
        if T == 0:  # no position to reduce over: every row is one without tokens
            return hidden.new_full((B, D), float("-inf"))
        return hidden.masked_fill(~keep, float("-inf")).amax(dim=1)
    rows = torch.arange(B, device=hidden.device)
    if mode in ("cls", "lasttoken"):
        if T == 0:
            return hidden.new_zeros(B, D)
        if mode == "cls":
            # The first kept position: the row's first real token (after a left padding and a
            # prompt left out), as sentence-transformers takes it.
            at = attention_mask.int().argmax(dim=1)  # (B,)
        else:
            # The last True of each row, found from the right so left padding works too.
            at = T - 1 - attention_mask.flip(1).int().argmax(dim=1)  # (B,)
        # A position left out (an empty row's) gives zeros, whatever it holds (NaN included).
        return torch.where(attention_mask[rows, at, None], hidden[rows, at], 0.0)  # (B, D)
    # Left-out positions become zeros, not states times 0: 0 * NaN is NaN, and whatever a
    # padded position holds must not reach the pooled vector.
    hidden = torch.where(keep, hidden, 0.0)  # (B, T, D)
    if mode == "weightedmean":
        return _weighted_mean(hidden, given, attention_mask)
    total = sequential_sum(hidden)  # (B, D)
    # A row without tokens divides by a tiny count instead of zero (sentence-transformers' 1e-9).
    count = keep.sum(dim=1).to(hidden.dtype).clamp(min=1e-9)  # (B, 1)
    return total / (count if mode == "mean" else count.sqrt())


def _weighted_mean(hidden: Tensor, given: Tensor, kept: Tensor) -> Tensor:
    """Position-weighted mean of the ``kept`` tokens, as sentence-transformers' weightedmean.

    The weight of position t is ``t + 1 - first``, ``first`` the row's first real token in the
    ``given`` mask: 1, 2, ... from the first real token whatever the padding side, and a
    prompt left out of ``kept`` keeps the weights its positions had (sentence-transformers'
    rule). Sums run in float32 for half-precision states: the weights' total grows as T^2 / 2
    and passes float16's maximum (65,504) at T = 362.
    """
    B, T, _ = hidden.shape
    work = torch.float32 if hidden.dtype in (torch.float16, torch.bfloat16) else hidden.dtype
    first = (
        given.int().argmax(dim=1) if T else torch.zeros(B, dtype=torch.int32, device=hidden.device)
    )
    position = torch.arange(1, T + 1, device=hidden.device)  # (T,) 1-based
    weights = (position - first.unsqueeze(1)) * kept  # (B, T), 0 where not kept
    weights = weights.to(work).unsqueeze(-1)  # (B, T, 1)
    total = sequential_sum(hidden.to(work) * weights)  # (B, D); left-out states are zeros
    # A row without tokens divides by a tiny total instead of zero (sentence-transformers' 1e-9).
    return (total / weights.sum(dim=1).clamp(min=1e-9)).to(hidden.dtype)


def sequential_sum(hidden: Tensor) -> Tensor:
    """(B, T, D) -> (B, D): the sum over T, position after position.

    The same row gives the same bits whatever padding surrounds it, so a text's embedding does
    not depend on its batch's padded length (nor on the padding side). ``hidden.sum(dim=1)``
    does not promise that: ATen's reduction picks its order from the tensor's shape, and at
    narrow widths (D = 16 here) the sum of the same real rows changed with T. A scan adds in
    order (on a CPU, accumulating in float64 for float32 rows): zeros before or after the real
    rows add nothing, exactly.
    """
    if hidden.shape[1] == 0:
        return hidden.sum(dim=1)
    return hidden.cumsum(dim=1)[:, -1]  # (B, T, D) running sums -> the last: (B, D)
