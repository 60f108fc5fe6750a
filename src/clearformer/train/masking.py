"""Masked-language-model batches: BERT's masking rule, drawn per (seed, step, example).

Of each text's real tokens (never a special one: ``[CLS]``, ``[SEP]``, ``[PAD]``, ``[UNK]``,
``[MASK]``), 15 % are chosen, at least one; a chosen token becomes ``[MASK]`` with
probability 0.8, a random token with 0.1, and stays itself with 0.1 (Devlin et al., 2019:
``[MASK]`` never occurs in fine-tuning, so the model must also predict tokens it can see,
and keep a good state for every token). The model is scored on the chosen positions only,
against the original tokens.

Every draw comes from a NumPy generator seeded by ``(stream, seed, step, example index)``
through ``SeedSequence`` (distinct tuples, independent streams): a pure function of those
numbers, never of a global generator or of the batch an example lands in. So an example is
masked the same in any micro-batch, on any rank and in a resumed run, and anew at every step.
The held-out set is masked once, by ``(split_seed, example)``: the same at every evaluation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

MASK_FRACTION = 0.15  # of a text's real tokens, chosen to be predicted
MASK_SHARE, RANDOM_SHARE = 0.8, 0.1  # of the chosen: -> [MASK], -> a random token; rest kept
TRAIN_STREAM, EVAL_STREAM = 0, 1  # the first number of every seed tuple


@dataclass(frozen=True)
class MaskingVocab:
    """What masking needs of a tokenizer: the ``[MASK]`` id, the special ids (never chosen)
    and the ids a random replacement is drawn from (every id that is not special)."""

    mask_id: int
    special_ids: frozenset[int]
    replacements: np.ndarray  # (R,) int64

    @classmethod
    def of(cls, mask_id: int, special_ids: Sequence[int], vocab_size: int) -> MaskingVocab:
        special = frozenset(int(i) for i in special_ids) | {int(mask_id)}
        keep = np.setdiff1d(np.arange(vocab_size, dtype=np.int64), np.fromiter(special, np.int64))
        return cls(int(mask_id), special, keep)

    def candidates(self, ids: Sequence[int]) -> np.ndarray:
        """The positions of ``ids`` that may be chosen (its real, non-special tokens)."""
        array = np.asarray(ids, dtype=np.int64)
        return np.flatnonzero(~np.isin(array, np.fromiter(self.special_ids, np.int64)))


def masked_count(candidates: int) -> int:
    """How many of a text's ``candidates`` tokens are chosen: 15 %, at least one. Fixed per
    text (only which ones is drawn), so a step's count of scored tokens is known before any
    draw: the loss divides by it."""
    return max(1, round(MASK_FRACTION * candidates))


def generator(stream: int, seed: int, step: int, index: int) -> np.random.Generator:
    """The draws of one example at one step (``stream``: training or held-out)."""
    return np.random.default_rng([stream, seed, step, index])


def mask_example(
    ids: Sequence[int], vocab: MaskingVocab, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One text masked by BERT's rule.

    Returns:
        (masked ids (T,), the chosen positions (k,) ascending, the original ids there (k,)).

    Raises:
        ValueError: a text without a token that may be masked.
    """
    original = np.asarray(ids, dtype=np.int64)
    candidates = vocab.candidates(original)
    if not len(candidates):
        raise ValueError(f"a text needs a real (non-special) token to mask, got ids {list(ids)}")
    chosen = np.sort(rng.choice(candidates, size=masked_count(len(candidates)), replace=False))
    fate = rng.random(len(chosen))  # < 0.8: [MASK]; < 0.9: a random token; else kept
    to_mask = chosen[fate < MASK_SHARE]
    to_random = chosen[(fate >= MASK_SHARE) & (fate < MASK_SHARE + RANDOM_SHARE)]
    masked = original.copy()
    masked[to_mask] = vocab.mask_id
    masked[to_random] = vocab.replacements[rng.integers(0, len(vocab.replacements), len(to_random))]
    return masked, chosen, original[chosen]


@dataclass(frozen=True)
class MaskedBatch:
    """Masked texts, packed (ids (N,) + ``cu_seqlens``) or padded (ids and mask (B, T)), and
    the positions to predict: ``positions`` (n,) index the packed ids, or the padded grid
    flattened to (B * T,); ``labels`` (n,) are the original ids there."""

    input_ids: Tensor  # (N,) or (B, T) int64, masked
    cu_seqlens: Tensor | None  # (B + 1,) int32 when packed
    attention_mask: Tensor | None  # (B, T) bool when padded, True = real token
    positions: Tensor  # (n,) int64
    labels: Tensor  # (n,) int64

    def to(self, device: torch.device) -> MaskedBatch:
        def move(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.to(device)

        return MaskedBatch(
            self.input_ids.to(device),
            move(self.cu_seqlens),
            move(self.attention_mask),
            self.positions.to(device),
            self.labels.to(device),
        )


def collate_masked(
    examples: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]], *, packed: bool, pad_id: int
) -> MaskedBatch:
    """:func:`mask_example` results -> one :class:`MaskedBatch`."""
    from .collate import pack_sequences, pad_sequences

    sequences = [ids.tolist() for ids, _, _ in examples]
    labels = torch.from_numpy(np.concatenate([original for _, _, original in examples]))
    if packed:
        tokens = pack_sequences(sequences, [0] * len(sequences))
        starts = tokens.cu_seqlens[:-1].long().tolist()  # (B,) each sequence's first row
        positions = [chosen + start for (_, chosen, _), start in zip(examples, starts, strict=True)]
        flat = torch.from_numpy(np.concatenate(positions))  # (n,) into the packed ids (N,)
        return MaskedBatch(tokens.input_ids, tokens.cu_seqlens, None, flat, labels)
    grid = pad_sequences(sequences, [0] * len(sequences), pad_id)
    T = grid.input_ids.shape[1]
    positions = [chosen + row * T for row, (_, chosen, _) in enumerate(examples)]
    flat = torch.from_numpy(np.concatenate(positions))  # (n,) into the (B * T,) grid
    return MaskedBatch(grid.input_ids, None, grid.attention_mask, flat, labels)
