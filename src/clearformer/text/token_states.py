"""Every token's last hidden state for a batch of token rows: what multi-vector and bge-m3
models read, where a sentence encoder pools.

A row is its token ids, then (ColBERT's query expansion) extra tokens appended after them,
which the encoder attends to or not. Rows are padded on the right into (B, T); a batch whose
tokens all attend to each other runs packed, as ``TextEncoder`` runs its batches
(``rows_alone``: a text's states do not depend on its batch-mates). Tokens
computed but never attended (expansion with ``attend=False``) need a key mask other than the
rows' own, which only the reference's stack takes (:func:`clearformer.reference.encoder`'s
``keys``): such batches, short queries, run there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .. import reference
from ..model import EncoderModel
from ..positions import past_pad_ids


@dataclass(frozen=True)
class TokenRow:
    """One text's tokens.

    Attributes:
        ids: the tokenizer's ids (special tokens and markers included).
        type_ids: their token types.
        extra: tokens appended after them (query expansion), all ``extra_id``.
        extra_attended: whether the encoder attends to the appended tokens.
    """

    ids: Sequence[int]
    type_ids: Sequence[int]
    extra: int = 0
    extra_attended: bool = True

    def __len__(self) -> int:
        return len(self.ids) + self.extra


@dataclass(frozen=True)
class PaddedRows:
    """Rows padded on the right.

    Attributes:
        input_ids: (B, T) int64; appended tokens hold ``extra_id``, padding ``pad_id``.
        token_type_ids: (B, T) int64.
        tokens: (B, T) bool, True = a text's token or an appended one.
        attended: (B, T) bool, True = a token other tokens attend to.
        texts: (B, T) bool, True = a text's own token (not appended, not padding).
    """

    input_ids: Tensor
    token_type_ids: Tensor
    tokens: Tensor
    attended: Tensor
    texts: Tensor


def pad_rows(rows: Sequence[TokenRow], pad_id: int, extra_id: int = 0) -> PaddedRows:
    """(B, T) tensors of ``rows``, T the longest row."""
    B, T = len(rows), max((len(r) for r in rows), default=0)
    ids = torch.full((B, T), pad_id, dtype=torch.int64)
    types = torch.zeros((B, T), dtype=torch.int64)
    tokens = torch.zeros((B, T), dtype=torch.bool)
    attended = torch.zeros((B, T), dtype=torch.bool)
    texts = torch.zeros((B, T), dtype=torch.bool)
    for b, row in enumerate(rows):
        n, end = len(row.ids), len(row)
        ids[b, :n] = torch.tensor(list(row.ids), dtype=torch.int64)
        types[b, :n] = torch.tensor(list(row.type_ids), dtype=torch.int64)
        ids[b, n:end] = extra_id
        tokens[b, :end] = True
        texts[b, :n] = True
        attended[b, : end if row.extra_attended else n] = True
    return PaddedRows(ids, types, tokens, attended, texts)


def token_states(model: EncoderModel, batch: PaddedRows) -> Tensor:
    """(B, T, D) last hidden states of ``batch``'s tokens (padding positions: zero on the
    packed route, anything on the reference route; callers keep ``batch.tokens`` only).
    Call under ``torch.inference_mode()``."""
    if bool((batch.attended == batch.tokens).all()):
        mask = batch.tokens
        return model(batch.input_ids, mask, batch.token_type_ids, rows_alone=True)
    # Positions 0 .. T-1: every row starts at 0 and its appended tokens follow its text, as
    # ColBERT places them; padding after them is computed and dropped. RoBERTa's positions
    # skip a literal pad id among a row's tokens, as on the packed route.
    positions = None
    if model.counts_past_pads:
        pad_id = model.config.pad_token_id
        positions = past_pad_ids(batch.input_ids, None, pad_id, real=batch.tokens)  # (B, T)
    x = model.embeddings(batch.input_ids, batch.token_type_ids, positions)  # (B, T, D)
    hidden, _, _ = reference.encoder(model.encoder, x, None, keys=batch.attended)
    return hidden  # (B, T, D)
