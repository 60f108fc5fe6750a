"""Small utilities shared by the tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


def lengths_mask(lengths: list[int], T: int | None = None) -> torch.Tensor:
    """(B, T) bool key-padding mask: row b has ``lengths[b]`` real tokens, then padding."""
    T = max(max(lengths), 1) if T is None else T
    return torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]


@contextlib.contextmanager
def intra_op_threads(count: int) -> Iterator[None]:
    """Run the block with PyTorch's intra-op thread count set to ``count``, then restore it."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)
