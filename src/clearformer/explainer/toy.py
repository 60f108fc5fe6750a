"""An untrained toy text encoder: a random :class:`~clearformer.EncoderModel` with a word-level
tokenizer, for exploring ``explain`` without a checkpoint (``clearformer explain --random``).

Its tokens are words and punctuation marks; each maps to an id by a stable hash, so the same
text always gives the same ids. It has the same interface as ``TextEncoder`` where ``explain``
needs one (``model``, ``tokenize``, ``pool``, ``pooling``, ``normalize``, ``max_length``).
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

import torch
from torch import Tensor

from ..config import EncoderConfig
from ..heads import pool
from ..model import EncoderModel

_WORD = re.compile(r"\w+|[^\w\s]")
PAD_ID = 0


@dataclass
class ToyBatch:
    input_ids: Tensor  # (B, T) int64
    attention_mask: Tensor  # (B, T) bool
    token_type_ids: Tensor | None
    tokens: list[list[str]]  # the words of each row's real tokens
    truncated: list[bool]


VOCAB_SIZE = 4096  # words are hashed into this many ids


class ToyTextEncoder:
    """A random encoder with a word tokenizer.

    Args:
        d_model, n_heads, n_layers: the stack's size (feed-forward width 4 * d_model).
        norm: "pre" or "post"; activation: see :class:`~clearformer.EncoderConfig`.
        backend: the attention backend the model runs in production.
        max_length: texts are cut to this many words.
        vocab_size: ids are hashed into [1, vocab_size).
        seed: initialises the parameters (the global random state is left as it was).
    """

    pooling = "mean"
    normalize = False

    def __init__(
        self,
        d_model: int = 64,
        n_heads: int = 4,
        n_layers: int = 2,
        *,
        norm: str = "pre",
        activation: str = "gelu",
        backend: str = "auto",
        max_length: int = 64,
        vocab_size: int = VOCAB_SIZE,
        seed: int = 0,
    ) -> None:
        config = EncoderConfig(
            d_model=d_model,
            n_heads=n_heads,
            n_layers=n_layers,
            dim_mlp=4 * d_model,
            norm=norm,
            activation=activation,
            backend=backend,
            vocab_size=vocab_size,
            max_positions=max_length,
            pad_token_id=PAD_ID,
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.model = EncoderModel(config).eval()
        self.config = config
        self.max_length = max_length

    def tokenize(self, texts: list[str]) -> ToyBatch:
        words = [_WORD.findall(text) for text in texts]
        truncated = [len(w) > self.max_length for w in words]
        words = [w[: self.max_length] for w in words]
        T = max(1, max(len(w) for w in words))
        ids = torch.full((len(words), T), PAD_ID, dtype=torch.long)
        mask = torch.zeros(len(words), T, dtype=torch.bool)
        vocab = self.config.vocab_size - 1
        for b, row in enumerate(words):
            for t, word in enumerate(row):
                ids[b, t] = 1 + zlib.crc32(word.lower().encode("utf-8")) % vocab
                mask[b, t] = True
        return ToyBatch(ids, mask, None, words, truncated)

    def pool(self, hidden: Tensor, attention_mask: Tensor) -> Tensor:
        """(B, T, D) token states + (B, T) bool mask -> (B, D), the mean of the real tokens."""
        return pool(hidden, attention_mask, self.pooling)
