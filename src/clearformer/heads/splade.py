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

Why max pools the logits: relu and log1p never decrease, so the largest weight of a text is
the weight of its largest logit, to the bit. Max pooling therefore reduces the raw logits
(in the head's dtype) per text and applies the activation to the (B, V) result only, instead
of to every token's V logits; sum pooling must activate each token's logits first.
"""

from __future__ import annotations

import bisect
import warnings
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
# index_reduce_ (the scatter-max below) warns once that its API is in beta; the call here uses
# its stable form (dim, index, source, "amax"), so the one message it would print is dropped.
warnings.filterwarnings("ignore", message=r"index_reduce\(\) is in beta", category=UserWarning)


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
    if config.pooling == "max":
        return _max_pool(rows, cu_seqlens, logits, config, width, chunk_tokens)
    bounds = cu_seqlens.tolist()
    B, N = len(bounds) - 1, rows.shape[0]
    out = torch.zeros(B, width, device=rows.device)  # (B, V) float32
    for start in range(0, N, chunk_tokens):
        end = min(start + chunk_tokens, N)
        weights = _activated(logits(rows[start:end]).float(), config)  # (n, V)
        # Each text's tokens that fall in this chunk, summed into its row.
        for b in _texts_in(bounds, start, end):
            lo, hi = max(bounds[b], start) - start, min(bounds[b + 1], end) - start
            if lo < hi:  # else a text without tokens
                out[b] += weights[lo:hi].sum(dim=0)
    return out


def _max_pool(rows, cu_seqlens, logits, config, width, chunk_tokens) -> Tensor:
    """Max pooling: each text's largest logit per entry, then the activation on (B, V)."""
    B, N = len(cu_seqlens) - 1, rows.shape[0]
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]  # (B,)
    text_of = torch.repeat_interleave(
        torch.arange(B, device=rows.device), lengths.to(rows.device).long()
    )  # (N,): the text each packed row belongs to
    peak = None  # (B, V) in the logits' dtype
    for start in range(0, N, chunk_tokens):
        end = min(start + chunk_tokens, N)
        chunk = logits(rows[start:end])  # (n, V)
        if peak is None:
            # -inf: a text without tokens keeps it, and relu turns it into zero weights.
            peak = torch.full((B, width), float("-inf"), dtype=chunk.dtype, device=rows.device)
        peak.index_reduce_(0, text_of[start:end], chunk, "amax")  # scatter-max by text
    if peak is None:  # no tokens at all
        return torch.zeros(B, width, device=rows.device)
    return _activated(peak.float(), config)  # (B, V) float32


def _activated(logits: Tensor, config: SpladeConfig) -> Tensor:
    """log1p(relu(z)), and log1p once more for ``"log1p_relu"``; in place on ``logits``."""
    weights = logits.relu_().log1p_()
    if config.activation == "log1p_relu":
        weights.log1p_()
    return weights


def _texts_in(bounds: list[int], start: int, end: int) -> range:
    """The texts with a token in ``[start, end)`` (texts without tokens have none)."""
    first = bisect.bisect_right(bounds, start) - 1
    last = bisect.bisect_left(bounds, end)  # texts first..last-1 start before `end`
    return range(max(first, 0), min(last, len(bounds) - 1))
