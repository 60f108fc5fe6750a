"""Sentence embeddings from token states: mean, CLS or max pooling, as sentence-transformers.

The mode comes from the checkpoint's pooling module config (``1_Pooling/config.json``): the
legacy ``pooling_mode_*_tokens`` booleans or the newer ``pooling_mode`` string.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .checkpoint import CheckpointError

POOLING_MODES = ("mean", "cls", "max")
_LEGACY_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}


def pooling_mode_from_config(config: dict[str, Any] | None) -> str:
    """The pooling mode a sentence-transformers pooling config asks for ("mean" when absent).

    Raises:
        CheckpointError: a mode clearformer does not implement, or several modes at once.
    """
    if not config:
        return "mean"  # what sentence-transformers uses for a plain transformers checkpoint
    mode = config.get("pooling_mode")
    if mode is None:
        modes = [name for key, name in _LEGACY_KEYS.items() if config.get(key)]
    else:
        modes = [mode] if isinstance(mode, str) else list(mode)
    if len(modes) != 1 or modes[0] not in POOLING_MODES:
        raise CheckpointError(
            f"unsupported pooling {modes or 'none'} in the pooling config; supported: one of "
            f"{POOLING_MODES}"
        )
    return modes[0]


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
