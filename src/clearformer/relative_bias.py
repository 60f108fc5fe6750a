"""A learned bias on attention scores by relative distance (T5: Raffel et al., 2020; MPNet).

Every pair (query i, key j) falls into a bucket by its signed distance ``j - i``: half the
buckets for keys before the query, half for keys after; within each half, distances below
``num_buckets / 4`` get a bucket each, and longer ones share logarithmically wider buckets up
to ``max_distance`` (beyond it, the last bucket). Each head learns one scalar per bucket, added
to its scores before the softmax.

The bias depends on distances only, so for sequences that start at position 0 the ``(H, L, L)``
bias of the longest one holds every shorter one in its top-left corner: one table per call
serves every layer (MPNet shares it across layers) and every sequence of a packed batch.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = ["RelativePositionBias", "relative_position_buckets"]


def relative_position_buckets(
    length: int, num_buckets: int, max_distance: int, device: torch.device | None = None
) -> Tensor:
    """(L, L) int64: the bucket of each (query i, key j) pair, bidirectional.

    The bucketing of T5 and MPNet (``relative_position_bucket`` in their reference code).
    """
    positions = torch.arange(length, device=device)
    n = positions[:, None] - positions[None, :]  # (L, L): i - j, positive for keys before i
    half = num_buckets // 2
    buckets = (n < 0).long() * half  # keys after the query use the upper half
    n = n.abs()
    exact = half // 2  # distances below this get a bucket each
    # Longer distances: log-spaced buckets from `exact` up to `max_distance`. The clamp keeps
    # log() finite where n < exact; those entries take the exact branch below.
    far = (
        exact
        + (
            torch.log(n.clamp(min=1).float() / exact)
            / math.log(max_distance / exact)
            * (half - exact)
        ).long()
    )
    far = far.clamp(max=half - 1)
    return buckets + torch.where(n < exact, n, far)


class RelativePositionBias(nn.Module):
    """``length -> (H, L, L)`` additive score bias, one learned scalar per head and bucket."""

    def __init__(self, num_buckets: int, max_distance: int, n_heads: int) -> None:
        super().__init__()
        if num_buckets < 4 or num_buckets % 2:
            raise ValueError(f"num_buckets must be an even int >= 4, got {num_buckets!r}")
        if max_distance <= num_buckets // 4:
            raise ValueError(
                f"max_distance must exceed num_buckets / 4 = {num_buckets // 4}, "
                f"got {max_distance!r}"
            )
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.weight = nn.Parameter(torch.zeros(num_buckets, n_heads))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, length: int) -> Tensor:
        buckets = relative_position_buckets(
            length, self.num_buckets, self.max_distance, self.weight.device
        )  # (L, L)
        return self.weight[buckets].permute(2, 0, 1)  # (L, L, H) -> (H, L, L)

    def extra_repr(self) -> str:
        return f"num_buckets={self.num_buckets}, max_distance={self.max_distance}"
