"""SPLADE pooling: token states -> one weight per vocabulary entry, chunk by chunk.

For each real token t of a text and each vocabulary entry v, the masked-LM head gives a logit
``z[t, v]``; SPLADE keeps ``w[t, v] = log(1 + relu(z[t, v]))`` (``activation="log1p_relu"``
takes ``log1p`` once more, as OpenSearch's models do) and pools over the text's tokens,
``max`` (SPLADE v2 and later) or ``sum`` (the first SPLADE). A logit at or below zero gives a
zero weight, which is what makes the result sparse.

Why chunks: the logits are (tokens x V), and at BERT's V = 30,522 a padded batch's (B, T, V)
logits are the memory peak of the whole model (64 texts x 256 tokens: 2 GB in float32), most
of it spent on padding. Here the rows are packed (real tokens only, (N, D)), and the head runs
on ``chunk_tokens`` of them at a time; each chunk's weights are reduced into the (B, V) result
at once and freed, so the peak is ``chunk_tokens x V`` plus the result, whatever B and T.
sentence-transformers' ``SpladePooling`` is the reference: the same formula, on the padded
logits with padded positions multiplied by zero (which max and sum then ignore, since every
weight is at least zero).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ..checks import check_choice, check_positive_int

__all__ = [
    "DEFAULT_CHUNK_TOKENS",
    "SPLADE_ACTIVATIONS",
    "SPLADE_POOLINGS",
    "SpladeConfig",
    "splade_pool",
]

SPLADE_POOLINGS = ("max", "sum")
SPLADE_ACTIVATIONS = ("relu", "log1p_relu")  # sentence-transformers' names
# Tokens whose logits exist at once: 256 x 30,522 float32 is 31 MB, small beside a BERT-base
# batch's activations, and large enough that each chunk's matrix product runs at full speed.
DEFAULT_CHUNK_TOKENS = 256


@dataclass(frozen=True)
class SpladeConfig:
    """What a sentence-transformers ``SpladePooling`` module asks for.

    Attributes:
        pooling: ``"max"`` or ``"sum"`` over a text's tokens.
        activation: ``"relu"``: ``log1p(relu(z))``; ``"log1p_relu"``: ``log1p(log1p(relu(z)))``.
    """

    pooling: str = "max"
    activation: str = "relu"

    def __post_init__(self) -> None:
        check_choice(self.pooling, SPLADE_POOLINGS, "SpladeConfig.pooling")
        check_choice(self.activation, SPLADE_ACTIVATIONS, "SpladeConfig.activation")


def splade_pool(
    rows: Tensor,
    cu_seqlens: Tensor,
    logits: Callable[[Tensor], Tensor],
    config: SpladeConfig,
    width: int,
    *,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> Tensor:
    """SPLADE weights of packed texts.

    Args:
        rows: (N, D) token states of B texts, packed (real tokens only, text after text).
        cu_seqlens: (B + 1,) cumulative lengths: text b is ``rows[cu_seqlens[b]:cu_seqlens[b+1]]``.
        logits: the masked-LM head, (n, D) -> (n, V).
        config: pooling and activation.
        width: V, the logits per token.
        chunk_tokens: tokens whose logits exist at once (the memory peak is chunk_tokens x V).

    Returns:
        (B, V) float32 weights, zero for a text without tokens.
    """
    check_positive_int(chunk_tokens, "chunk_tokens")
    bounds = cu_seqlens.tolist()
    B, N = len(bounds) - 1, rows.shape[0]
    # Zero, not -inf, to start a max: every weight is at least zero, and a text without
    # tokens then pools to zeros, as sentence-transformers' masked rows do.
    out = torch.zeros(B, width, device=rows.device)  # (B, V) float32
    for start in range(0, N, chunk_tokens):
        end = min(start + chunk_tokens, N)
        weights = logits(rows[start:end]).float().relu_().log1p_()  # (n, V)
        if config.activation == "log1p_relu":
            weights.log1p_()
        # Each text's tokens that fall in this chunk, reduced into its row.
        for b in _texts_in(bounds, start, end):
            lo, hi = max(bounds[b], start) - start, min(bounds[b + 1], end) - start
            if lo >= hi:
                continue  # a text without tokens
            part = weights[lo:hi]  # (tokens of text b in the chunk, V)
            if config.pooling == "max":
                torch.maximum(out[b], part.amax(dim=0), out=out[b])
            else:
                out[b] += part.sum(dim=0)
    return out


def _texts_in(bounds: list[int], start: int, end: int) -> range:
    """The texts with a token in ``[start, end)`` (texts without tokens have none)."""
    first = bisect.bisect_right(bounds, start) - 1
    last = bisect.bisect_left(bounds, end)  # texts first..last-1 start before `end`
    return range(max(first, 0), min(last, len(bounds) - 1))
