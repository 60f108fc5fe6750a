"""Unpad once at the stack's edge, repad once at the end.

A ragged batch padded to ``(B, T, D)`` spends most of its work on padding when lengths vary.
Linear layers, norms and the feed-forward network treat every row alike, so they can run on the
real tokens only, packed into ``(N, D)``. Only attention needs to know where each sequence
starts; ``cu_seqlens`` tells it (the flash-attention convention).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
from torch import Tensor

__all__ = [
    "PackedLayout",
    "equal_length_runs",
    "layout_from_cu_seqlens",
    "pack_layout",
    "repad",
    "unpad",
]


@dataclass(frozen=True)
class PackedLayout:
    """Where the real tokens of a padded ``(B, T)`` batch live once packed into ``(N,)`` rows.

    Attributes:
        indices: ``(N,)`` int64, flat positions ``b * T + t`` of the real tokens, in order.
        cu_seqlens: ``(B + 1,)`` int32, cumulative lengths; sequence b is rows
            ``cu_seqlens[b]:cu_seqlens[b + 1]``.
        offsets: the same cumulative lengths as Python ints (so attention can slice without
            synchronising with the device again).
        max_seqlen: the longest sequence.
        batch, seqlen: the padded shape ``(B, T)`` to restore.
    """

    indices: Tensor
    cu_seqlens: Tensor
    offsets: tuple[int, ...]
    max_seqlen: int
    batch: int
    seqlen: int

    @property
    def num_tokens(self) -> int:
        return self.offsets[-1]

    @property
    def lengths(self) -> list[int]:
        return [b - a for a, b in zip(self.offsets[:-1], self.offsets[1:], strict=True)]

    # Derived once per layout, on first use, and then shared by every layer of the call.
    @cached_property
    def runs(self) -> list[tuple[int, int, int]]:
        """``(first row, sequences, length)`` of each run of equally long sequences."""
        return equal_length_runs(self.offsets)

    @cached_property
    def positions(self) -> Tensor:
        """(N,) int64: each row's position within its own sequence (restarting at 0)."""
        starts = self.cu_seqlens[:-1].to(torch.int64)  # (B,)
        lengths = self.cu_seqlens.diff().to(torch.int64)  # (B,)
        rows = torch.arange(self.num_tokens, device=self.cu_seqlens.device)  # (N,)
        return rows - torch.repeat_interleave(starts, lengths, output_size=self.num_tokens)


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


def pack_layout(mask: Tensor) -> PackedLayout:
    """Layout of the real tokens of a ``(B, T)`` bool mask (True = real token).

    Real tokens need not be contiguous: whatever positions are True are packed in order.
    """
    batch, seqlen = mask.shape
    lengths = mask.sum(dim=1, dtype=torch.int32)  # (B,)
    cu_seqlens = torch.nn.functional.pad(torch.cumsum(lengths, 0, dtype=torch.int32), (1, 0))
    indices = torch.nonzero(mask.reshape(-1), as_tuple=False).flatten()  # (N,)
    offsets = tuple(int(x) for x in cu_seqlens.tolist())
    max_seqlen = int(lengths.max()) if batch > 0 else 0
    return PackedLayout(indices, cu_seqlens, offsets, max_seqlen, batch, seqlen)


def layout_from_cu_seqlens(cu_seqlens: Tensor, name: str = "cu_seqlens") -> PackedLayout:
    """Layout of rows the caller packed already: sequence b is rows
    ``cu_seqlens[b]:cu_seqlens[b + 1]``. Repadded, they fill a ``(B, L_max)`` grid from the left.

    Raises:
        TypeError: ``cu_seqlens`` is not an integer tensor.
        ValueError: it is not 1-D with at least two entries, does not start at 0, or decreases.
    """
    if not isinstance(cu_seqlens, Tensor):
        raise TypeError(
            f"{name} must be a (B + 1,) integer tensor, got {type(cu_seqlens).__name__}"
        )
    if (
        cu_seqlens.dtype.is_floating_point
        or cu_seqlens.dtype.is_complex
        or cu_seqlens.dtype == torch.bool
    ):
        raise TypeError(f"{name} must hold integers, got dtype {cu_seqlens.dtype}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(
            f"{name} must have shape (B + 1,) with B >= 1, got {tuple(cu_seqlens.shape)}"
        )
    offsets = tuple(int(x) for x in cu_seqlens.tolist())  # one host copy, for every layer
    lengths = [b - a for a, b in zip(offsets[:-1], offsets[1:], strict=True)]
    if offsets[0] != 0 or min(lengths) < 0:
        raise ValueError(
            f"{name} must start at 0 and never decrease (cumulative lengths), got "
            f"{list(offsets[:8])}{' ...' if len(offsets) > 8 else ''}"
        )
    device = cu_seqlens.device
    batch, longest = len(lengths), max(lengths)
    cu = cu_seqlens.to(torch.int32)
    counts = torch.tensor(lengths, device=device)  # (B,)
    sequence = torch.repeat_interleave(torch.arange(batch, device=device), counts)  # (N,)
    starts = torch.repeat_interleave(cu[:-1].to(torch.int64), counts)  # (N,)
    within = torch.arange(offsets[-1], device=device) - starts  # (N,) position in its sequence
    indices = sequence * longest + within  # (N,) flat positions in the (B, L_max) grid
    return PackedLayout(indices, cu, offsets, longest, batch, longest)


def unpad(x: Tensor, mask: Tensor) -> tuple[Tensor, PackedLayout]:
    """``(B, T, D)`` padded + ``(B, T)`` mask -> ``(N, D)`` real rows and their layout."""
    layout = pack_layout(mask)
    rows = x.reshape(-1, x.shape[-1]).index_select(0, layout.indices)  # (B*T, D) -> (N, D)
    return rows, layout


def repad(rows: Tensor, layout: PackedLayout) -> Tensor:
    """``(N, D)`` packed rows -> ``(B, T, D)``, with zeros at padded positions."""
    dim = rows.shape[-1]
    out = rows.new_zeros(layout.batch * layout.seqlen, dim)  # (B*T, D)
    # In place on a fresh buffer: one scatter, no second copy of the zeros. Autograd records it
    # (the gradient of ``rows`` is the gathered output gradient).
    out.index_copy_(0, layout.indices, rows)
    return out.view(layout.batch, layout.seqlen, dim)  # (B, T, D)
