"""The models the tasks train: an encoder and a head (pooled and linear; or the masked-LM
head on the masked rows), logits out.

Each model's ``forward(batch, checkpointing=None)`` takes the task's batch and returns (B, L)
logits; ``checkpointing`` is the call's choice to recompute activations in backward (the
trainer's ``checkpointing`` flag), handed to the encoder. Token batches come packed (ids (N,)
with ``cu_seqlens``: no padding reaches the model) or padded; the one encoder call per kind
is :func:`pooled_tokens`.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..config import EncoderConfig
from ..dropout import Dropout
from ..encoder import Encoder
from ..heads import MaskedLMHead, pool
from ..model import EncoderModel
from ..padding import layout_from_cu_seqlens, repad
from .collate import PackedBatch, PaddedBatch, VectorBatch
from .masking import MaskedBatch


def pooled_tokens(
    model: EncoderModel,
    batch: PackedBatch | PaddedBatch,
    mode: str,
    *,
    checkpointing: bool | None = None,
) -> Tensor:
    """(B, D) pooled states of a token batch: the training loop's one encoder call."""
    if isinstance(batch, PackedBatch):
        rows = model(batch.input_ids, cu_seqlens=batch.cu_seqlens, checkpointing=checkpointing)
        return pool_packed(rows, batch.cu_seqlens, mode)  # (N, D) -> (B, D)
    hidden = model(batch.input_ids, batch.attention_mask, checkpointing=checkpointing)
    return pool(hidden, batch.attention_mask, mode)  # (B, T, D) -> (B, D)


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

    def forward(self, batch: VectorBatch, checkpointing: bool | None = None) -> Tensor:
        x = self.embed(batch.inputs)  # (B, T, F) -> (B, T, D)
        B = x.shape[0]
        if self.cls is not None:
            x = torch.cat([self.cls.expand(B, -1, -1), x], dim=1)  # (B, T + 1, D)
        x = x + self.positions
        # (B, T', D); every position is real, no mask needed
        hidden = self.encoder(x, checkpointing=checkpointing)
        pooled = hidden[:, 0] if self.pooling == "cls" else hidden.mean(dim=1)  # (B, D)
        return self.head(pooled)  # (B, L)


class TextClassifier(nn.Module):
    """Token ids -> EncoderModel -> pooled over real tokens -> dropout -> linear head."""

    def __init__(self, model: EncoderModel, num_labels: int, pooling: str, dropout: float):
        super().__init__()
        self.model = model
        self.pooling = pooling
        self.dropout = Dropout(dropout)
        self.head = nn.Linear(model.config.d_model, num_labels)

    def forward(
        self, batch: PackedBatch | PaddedBatch, checkpointing: bool | None = None
    ) -> Tensor:
        pooled = pooled_tokens(self.model, batch, self.pooling, checkpointing=checkpointing)
        return self.head(self.dropout(pooled))  # (B, L)


class MaskedLanguageModel(nn.Module):
    """Masked token ids -> EncoderModel -> the rows to predict -> MaskedLMHead -> (n, V).

    The head decodes with the word-embedding table itself (tied, as BERT: one (V, D) table,
    trained as input and as output), and only the masked rows reach it: its (D, V) projection
    then costs n rows, about 15 % of the batch's N, instead of every row.
    """

    def __init__(self, model: EncoderModel, head: MaskedLMHead) -> None:
        super().__init__()
        self.model = model
        self.head = head

    @property
    def decoder_weight(self) -> Tensor:
        """The (V, D) table the head decodes with: the word embeddings, not a copy."""
        return self.model.embeddings.word.weight

    def forward(self, batch: MaskedBatch, checkpointing: bool | None = None) -> Tensor:
        ids, options = batch.input_ids, {"checkpointing": checkpointing}
        if batch.cu_seqlens is not None:
            rows = self.model(ids, cu_seqlens=batch.cu_seqlens, **options)  # (N, D)
        else:
            hidden = self.model(ids, batch.attention_mask, **options)  # (B, T, D)
            rows = hidden.reshape(-1, hidden.shape[-1])  # (B * T, D)
        picked = rows.index_select(0, batch.positions)  # (N, D) -> (n, D): masked rows only
        return self.head(picked, self.decoder_weight)  # (n, V)


class SentenceEmbedder(nn.Module):
    """Token ids -> EncoderModel -> SentenceHead (pooling, then the checkpoint's Dense and
    Normalize modules) -> (B, width) embeddings: what ``TextEncoder.encode`` computes, with
    gradients. Packed batches are repadded for the head only, after the encoder: no padded
    position reaches a linear layer."""

    def __init__(self, model: EncoderModel, head: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.head = head

    def forward(
        self, batch: PackedBatch | PaddedBatch, checkpointing: bool | None = None
    ) -> Tensor:
        if isinstance(batch, PackedBatch):
            rows = self.model(
                batch.input_ids, cu_seqlens=batch.cu_seqlens, checkpointing=checkpointing
            )  # (N, D)
            layout = layout_from_cu_seqlens(batch.cu_seqlens)
            hidden = repad(rows, layout)  # (N, D) -> (B, T, D), zeros at padded positions
            lengths = batch.cu_seqlens.diff().long()  # (B,)
            positions = torch.arange(layout.seqlen, device=rows.device)  # (T,)
            mask = positions[None, :] < lengths[:, None]  # (B, T)
        else:
            mask = batch.attention_mask
            hidden = self.model(batch.input_ids, mask, checkpointing=checkpointing)
        return self.head(hidden, mask)  # (B, width)
