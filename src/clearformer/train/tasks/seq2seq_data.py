"""Batches of (source, target) token pairs for sequence-to-sequence training.

Teacher forcing: the decoder reads ``start + target`` and is scored on ``target + end``, one
position ahead. Only real target positions are scored: the model returns their logits packed
``(n, V)`` and the batch their labels ``(n,)``, so the trainer's summed cross-entropy never
sees padding.

:func:`seq2seq_model` builds the encoder-decoder both sequence-to-sequence tasks train
(``reverse``, ``translate``) from a run config.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ...seq2seq import Seq2SeqConfig, Seq2SeqTransformer
from ..config import TrainConfig


@dataclass(frozen=True)
class Seq2SeqBatch:
    src: Tensor  # (B, S) int64, padding after each source
    src_mask: Tensor  # (B, S) bool, True = real token
    tgt_in: Tensor  # (B, T) int64: start token, then the target
    tgt_mask: Tensor  # (B, T) bool
    labels: Tensor  # (n,) int64: target + end at the real positions of tgt_mask, row by row

    @property
    def padding_fraction(self) -> float:
        real = self.src_mask.sum().item() + self.tgt_mask.sum().item()
        return 1.0 - real / max(self.src_mask.numel() + self.tgt_mask.numel(), 1)

    def to(self, device: torch.device) -> Seq2SeqBatch:
        return Seq2SeqBatch(*(t.to(device) for t in (
            self.src, self.src_mask, self.tgt_in, self.tgt_mask, self.labels
        )))  # fmt: skip


def collate_pairs(
    pairs: Sequence[tuple[list[int], list[int]]], *, pad: int, bos: int, eos: int
) -> Seq2SeqBatch:
    B = len(pairs)
    S = max(max(len(s) for s, _ in pairs), 1)
    T = max(len(t) for _, t in pairs) + 1
    src = torch.full((B, S), pad, dtype=torch.long)
    tgt_in = torch.full((B, T), pad, dtype=torch.long)
    tgt_mask = torch.zeros(B, T, dtype=torch.bool)
    labels = []
    for row, (s, t) in enumerate(pairs):
        src[row, : len(s)] = torch.tensor(s, dtype=torch.long)
        tgt_in[row, : len(t) + 1] = torch.tensor([bos, *t], dtype=torch.long)
        tgt_mask[row, : len(t) + 1] = True
        labels += [*t, eos]
    return Seq2SeqBatch(src, src != pad, tgt_in, tgt_mask, torch.tensor(labels, dtype=torch.long))


def pair_padding(
    batches: Sequence[Sequence[int]], src_lengths: Sequence[int], tgt_lengths: Sequence[int]
) -> dict[str, float]:
    """The padding :func:`collate_pairs` would add to ``batches`` (lists of example indices):
    the source padded to its longest, the target (after the start token) to its longest.

    Returns ``pads_per_sequence`` (padded positions per example, source and target together)
    and ``padding_fraction`` (of all positions)."""
    pads = positions = examples = 0
    for batch in batches:
        S = max(max(src_lengths[i] for i in batch), 1)
        T = max(tgt_lengths[i] for i in batch) + 1
        real = sum(src_lengths[i] + tgt_lengths[i] + 1 for i in batch)
        positions += (S + T) * len(batch)
        pads += (S + T) * len(batch) - real
        examples += len(batch)
    return {
        "pads_per_sequence": pads / max(examples, 1),
        "padding_fraction": pads / max(positions, 1),
    }


class Seq2SeqForTraining(nn.Module):
    """A :class:`~clearformer.Seq2SeqTransformer` as the trainer calls models: ``model(batch)``
    gives the logits of the batch's real target positions, ``(n, V)``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, batch: Seq2SeqBatch, checkpointing: bool | None = None) -> Tensor:
        # checkpointing: the source encoder's blocks (the decoder keeps its activations).
        logits = self.model(
            batch.src, batch.src_mask, batch.tgt_in, batch.tgt_mask, checkpointing=checkpointing
        )  # (B, T, V)
        return logits[batch.tgt_mask]  # (n, V), in the labels' row-major order


def seq2seq_model(
    c: TrainConfig,
    *,
    src_vocab: int,
    tgt_vocab: int | None,
    max_positions: int,
    pad: int,
    bos: int,
    eos: int,
) -> Seq2SeqForTraining:
    """The encoder-decoder a run config describes: ``n_layers`` on each side, its width and
    dropout, and the task's vocabulary sizes, longest sequence and special tokens.
    ``tgt_vocab=None`` shares one table between source and target (see
    :class:`~clearformer.Seq2SeqConfig`); a number, even one equal to ``src_vocab``, gives the
    target its own."""
    model = Seq2SeqTransformer(
        Seq2SeqConfig(
            src_vocab_size=src_vocab,
            tgt_vocab_size=tgt_vocab,
            d_model=c.d_model,
            n_heads=c.n_heads,
            encoder_layers=c.n_layers,
            decoder_layers=c.n_layers,
            dim_mlp=c.dim_mlp,
            dropout=c.dropout,
            max_positions=max_positions,
            pad_id=pad,
            bos_id=bos,
            eos_id=eos,
        )
    )
    return Seq2SeqForTraining(model)
