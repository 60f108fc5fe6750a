"""Collators: examples -> one batch tensor, padded (B, T) or packed (N,).

Padded: ids (B, T) with the pad id after each sequence, mask (B, T) bool (True = real
token). Packed: every sequence's ids one after another, no padding at all, ids (N,) with
``cu_seqlens`` (B + 1,) int32 -- sequence b is ``ids[cu_seqlens[b]:cu_seqlens[b + 1]]``, the
layout flash-attention's varlen kernels and ``EncoderModel``'s packed input take.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class PaddedBatch:
    """Token sequences padded to the longest: ids and mask (B, T), labels (B,)."""

    input_ids: Tensor  # (B, T) int64
    attention_mask: Tensor  # (B, T) bool, True = real token
    labels: Tensor  # (B,) int64

    @property
    def padding_fraction(self) -> float:
        return 1.0 - self.attention_mask.sum().item() / max(self.attention_mask.numel(), 1)

    def to(self, device: torch.device) -> PaddedBatch:
        return PaddedBatch(
            *(
                t.to(device, non_blocking=True)
                for t in (self.input_ids, self.attention_mask, self.labels)
            )
        )


@dataclass(frozen=True)
class PackedBatch:
    """Token sequences concatenated: ids (N,), cu_seqlens (B + 1,), labels (B,)."""

    input_ids: Tensor  # (N,) int64
    cu_seqlens: Tensor  # (B + 1,) int32, cumulative lengths starting at 0
    max_seqlen: int
    labels: Tensor  # (B,) int64

    @property
    def padding_fraction(self) -> float:
        return 0.0  # nothing is padded: every position is a real token

    def to(self, device: torch.device) -> PackedBatch:
        return PackedBatch(
            self.input_ids.to(device),
            self.cu_seqlens.to(device),
            self.max_seqlen,
            self.labels.to(device),
        )


@dataclass(frozen=True)
class VectorBatch:
    """Fixed-length vector sequences (digits' patches): inputs (B, T, F), labels (B,)."""

    inputs: Tensor  # (B, T, F) float32
    labels: Tensor  # (B,) int64

    padding_fraction = 0.0

    def to(self, device: torch.device) -> VectorBatch:
        return VectorBatch(self.inputs.to(device), self.labels.to(device))


def pad_sequences(
    sequences: Sequence[Sequence[int]], labels: Sequence[int], pad_id: int
) -> PaddedBatch:
    """Pad token-id sequences to the longest of them."""
    _check_nonempty(sequences, labels)
    B, T = len(sequences), max(len(s) for s in sequences)
    ids = torch.full((B, T), pad_id, dtype=torch.int64)
    mask = torch.zeros((B, T), dtype=torch.bool)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = torch.as_tensor(seq, dtype=torch.int64)
        mask[row, : len(seq)] = True
    return PaddedBatch(ids, mask, torch.as_tensor(list(labels), dtype=torch.int64))


def pack_sequences(sequences: Sequence[Sequence[int]], labels: Sequence[int]) -> PackedBatch:
    """Concatenate token-id sequences: ids (N,), cu_seqlens (B + 1,) int32."""
    _check_nonempty(sequences, labels)
    lengths = torch.tensor([len(s) for s in sequences], dtype=torch.int32)
    if int(lengths.min()) == 0:
        raise ValueError("every sequence needs at least one token, got an empty one")
    cu_seqlens = torch.zeros(len(sequences) + 1, dtype=torch.int32)
    cu_seqlens[1:] = torch.cumsum(lengths, 0)
    ids = torch.cat([torch.as_tensor(s, dtype=torch.int64) for s in sequences])  # (N,)
    return PackedBatch(
        ids, cu_seqlens, int(lengths.max()), torch.as_tensor(list(labels), dtype=torch.int64)
    )


def unpack_to_padded(batch: PackedBatch, pad_id: int) -> PaddedBatch:
    """A packed batch as padded (B, T) ids and mask: the same sequences, the same order."""
    cu = batch.cu_seqlens.tolist()
    sequences = [batch.input_ids[cu[b] : cu[b + 1]].tolist() for b in range(len(cu) - 1)]
    return pad_sequences(sequences, batch.labels.tolist(), pad_id)


def _check_nonempty(sequences: Sequence, labels: Sequence) -> None:
    if not len(sequences):
        raise ValueError("a batch needs at least one sequence, got none")
    if len(sequences) != len(labels):
        raise ValueError(
            f"labels must give one label per sequence ({len(sequences)}), got {len(labels)}"
        )
