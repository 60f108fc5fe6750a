"""The models the tasks train: an encoder, pooling and a linear head, logits out.

Each model's ``forward(batch)`` takes the task's batch and returns (B, L) logits. The encoder
is called in one place per input kind (:func:`encode_tokens`), so that moving training to
packed batches is a change of one line there.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..config import EncoderConfig
from ..encoder import Encoder
from ..heads import pool
from ..model import EncoderModel
from .collate import PaddedBatch, VectorBatch


def encode_tokens(model: EncoderModel, batch: PaddedBatch) -> tuple[Tensor, Tensor]:
    """Token states (B, T, D) and their mask (B, T): the training loop's one encoder call.

    Packed, once ``EncoderModel.forward`` takes ``cu_seqlens``, this becomes
    ``model(batch.input_ids, cu_seqlens=batch.cu_seqlens)`` on a
    :class:`~.collate.PackedBatch`, with ``(N, D)`` states pooled per sequence.
    """
    return model(batch.input_ids, batch.attention_mask), batch.attention_mask


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

    def forward(self, batch: PaddedBatch) -> Tensor:
        hidden, mask = encode_tokens(self.model, batch)  # (B, T, D), (B, T)
        pooled = pool(hidden, mask, self.pooling)  # (B, D)
        return self.head(self.dropout(pooled))  # (B, L)
