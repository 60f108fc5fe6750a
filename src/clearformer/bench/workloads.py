"""Model sizes and the batches the suite runs on."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class ModelSize:
    """The shape of an encoder stack (BERT-style: post-norm, GELU)."""

    name: str
    n_layers: int
    d_model: int
    n_heads: int
    dim_mlp: int
    max_length: int = 512  # longest sequence the benchmarked models are built for


SIZES = {
    "minilm": ModelSize("minilm", 6, 384, 12, 1536),
    "bert-base": ModelSize("bert-base", 12, 768, 12, 3072),
}


@dataclass(frozen=True)
class Batch:
    """Inputs every implementation receives: embeddings and a key-padding mask."""

    kind: str  # "fixed" or "ragged"
    x: Tensor  # (B, T, D) float32 input vectors
    mask: Tensor  # (B, T) bool, True = real token
    lengths: tuple[int, ...]  # real tokens per sequence

    @property
    def real_tokens(self) -> int:
        return sum(self.lengths)

    @property
    def padding(self) -> float:
        return 1.0 - self.real_tokens / max(self.mask.numel(), 1)

    def describe(self) -> str:
        B, T = self.mask.shape
        if self.kind == "fixed":
            return f"B {B} x T {T}"
        return f"B {B}, T U[{min(self.lengths)}, {max(self.lengths)}] pad {T}"


def fixed_batch(size: ModelSize, batch: int, seqlen: int, seed: int = 0) -> Batch:
    """``batch`` sequences of exactly ``seqlen`` tokens."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, seqlen, size.d_model, generator=gen)  # (B, T, D)
    mask = torch.ones(batch, seqlen, dtype=torch.bool)
    return Batch("fixed", x, mask, (seqlen,) * batch)


def ragged_batch(
    size: ModelSize, batch: int, min_length: int, max_length: int, seed: int = 0
) -> Batch:
    """``batch`` sequences with lengths uniform in ``[min_length, max_length]``, padded to the
    maximum (as a tokenizer padding to a fixed length would)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_length, max_length + 1, (batch,), generator=gen)  # (B,)
    x = torch.randn(batch, max_length, size.d_model, generator=gen)  # (B, T, D)
    mask = torch.arange(max_length)[None, :] < lengths[:, None]  # (B, T)
    x = x * mask[..., None]  # padded vectors are zero, as embeddings of a pad token would be
    return Batch("ragged", x, mask, tuple(int(n) for n in lengths))
