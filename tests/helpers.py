"""Small utilities shared by the tests."""

from __future__ import annotations

import torch


def lengths_mask(lengths: list[int], T: int | None = None) -> torch.Tensor:
    """(B, T) bool key-padding mask: row b has ``lengths[b]`` real tokens, then padding."""
    T = max(max(lengths), 1) if T is None else T
    return torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
