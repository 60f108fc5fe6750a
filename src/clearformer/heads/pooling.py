"""Pooling, the sentence-embedding head: one vector per sequence from its real tokens, as
sentence-transformers computes it."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["POOLING_MODES", "pool"]

POOLING_MODES = ("mean", "cls", "max")


def pool(hidden: Tensor, attention_mask: Tensor, mode: str = "mean") -> Tensor:
    """Pool token states into one vector per sequence.

    Args:
        hidden: (B, T, D) token states.
        attention_mask: (B, T) bool, True = real token.
        mode: ``mean`` (average of real tokens), ``cls`` (first token), ``max`` (per feature).

    Returns:
        (B, D).
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
    if mode == "cls":
        return hidden[:, 0]
    keep = attention_mask.unsqueeze(-1)  # (B, T, 1)
    if mode == "max":
        return hidden.masked_fill(~keep, float("-inf")).amax(dim=1)
    total = (hidden * keep).sum(dim=1)  # (B, D)
    # A row without tokens divides by a tiny count instead of zero (sentence-transformers' 1e-9).
    count = keep.sum(dim=1).to(hidden.dtype).clamp(min=1e-9)  # (B, 1)
    return total / count
