"""The models the tasks train: an encoder, pooling and a linear head, logits out.

Each model's ``forward(batch)`` takes the task's batch and returns (B, L) logits. Token batches
come packed (ids (N,) with ``cu_seqlens``: no padding reaches the model) or padded; the one
encoder call per kind is :func:`pooled_tokens`.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..config import EncoderConfig
from ..encoder import Encoder
from ..heads import pool
from ..model import EncoderModel
from .collate import PackedBatch, PaddedBatch, VectorBatch


def pooled_tokens(model: EncoderModel, batch: PackedBatch | PaddedBatch, mode: str) -> Tensor:
    """(B, D) pooled states of a token batch: the training loop's one encoder call."""
    if isinstance(batch, PackedBatch):
        rows = model(batch.input_ids, cu_seqlens=batch.cu_seqlens)  # (N, D)
        return pool_packed(rows, batch.cu_seqlens, mode)
    hidden = model(batch.input_ids, batch.attention_mask)  # (B, T, D)
    return pool(hidden, batch.attention_mask, mode)


def pool_packed(rows: Tensor, cu_seqlens: Tensor, mode: str) -> Tensor:
    """(N, D) packed states -> (B, D): each sequence's first row (``cls``) or mean (``mean``)."""
    starts = cu_seqlens[:-1].long()  # (B,)
    if mode == "cls":
        return rows.index_select(0, starts)
    lengths = cu_seqlens.diff().long()  # (B,)
    sequence = torch.repeat_interleave(torch.arange(len(lengths), device=rows.device), lengths)
    sums = rows.new_zeros(len(lengths), rows.shape[-1]).index_add(0, sequence, rows)  # (B, D)
    return sums / lengths.clamp(min=1)[:, None].to(rows.dtype)


class PatchClassifier(nn.Module):
    """Image patches -> linear embedding + learned positions (+ a CLS token) -> Encoder ->
    pooled -> linear head.

    Args:
        config: the encoder stack (vectors in: ``vocab_size=None``).
        tokens: T, patches per image; features: F, values per patch.
        num_labels: L, classes.
        pooling: ``cls`` (a learned token put first, its state classifies) or ``mean``.
    """

    def __init__(
        self, config: EncoderConfig, tokens: int, features: int, num_labels: int, pooling: str
    ) -> None:
        super().__init__()
        D = config.d_model
        self.pooling = pooling
        self.embed = nn.Linear(features, D)
        extra = 1 if pooling == "cls" else 0
        self.cls = nn.Parameter(torch.zeros(1, 1, D)) if extra else None
        # Small random positions, as ViT: zeros would make every patch look alike at the start.
        self.positions = nn.Parameter(torch.randn(1, tokens + extra, D) * 0.02)
        self.encoder = Encoder(config)
        self.head = nn.Linear(D, num_labels)

    def forward(self, batch: VectorBatch) -> Tensor:
        x = self.embed(batch.inputs)  # (B, T, F) -> (B, T, D)
        B = x.shape[0]
        if self.cls is not None:
            x = torch.cat([self.cls.expand(B, -1, -1), x], dim=1)  # (B, T + 1, D)
        x = x + self.positions
        hidden = self.encoder(x)  # (B, T', D); every position is real, no mask needed
        pooled = hidden[:, 0] if self.pooling == "cls" else hidden.mean(dim=1)  # (B, D)
        return self.head(pooled)  # (B, L)


class TextClassifier(nn.Module):
    """Token ids -> EncoderModel -> pooled over real tokens -> dropout -> linear head."""

    def __init__(self, model: EncoderModel, num_labels: int, pooling: str, dropout: float):
        super().__init__()
        self.model = model
        self.pooling = pooling
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(model.config.d_model, num_labels)

    def forward(self, batch: PackedBatch | PaddedBatch) -> Tensor:
        pooled = pooled_tokens(self.model, batch, self.pooling)  # (B, D)
        return self.head(self.dropout(pooled))  # (B, L)
