"""The masked-language-model head: token states -> logits over the vocabulary.

``logits = Norm(act(Dense(h))) @ E^T + b``: a dense layer, an activation and a LayerNorm
transform each token's state, and the decoder is the word-embedding table itself (tied, as
BERT-family and ModernBERT checkpoints are: the file holds the table once, in the embeddings),
so the head takes that table at call time instead of keeping a copy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..checks import check_choice, check_positive_float, check_positive_int
from .classification import CLASSIFIER_ACTIVATIONS

__all__ = ["MaskedLMConfig", "MaskedLMHead"]


@dataclass(frozen=True)
class MaskedLMConfig:
    """The shape of a :class:`MaskedLMHead`.

    Attributes:
        d_model: width D of the token states.
        vocab_size: V, the logits per token (the embedding table's rows).
        activation: after the dense layer, one of :data:`CLASSIFIER_ACTIVATIONS`.
        dense_bias, norm_bias, decoder_bias: which parts have biases.
        norm_eps: the LayerNorm's epsilon.
    """

    d_model: int
    vocab_size: int
    activation: str = "gelu"
    dense_bias: bool = True
    norm_eps: float = 1e-5
    norm_bias: bool = True
    decoder_bias: bool = True

    def __post_init__(self) -> None:
        check_positive_int(self.d_model, "MaskedLMConfig.d_model")
        check_positive_int(self.vocab_size, "MaskedLMConfig.vocab_size")
        check_choice(self.activation, CLASSIFIER_ACTIVATIONS, "MaskedLMConfig.activation")
        check_positive_float(self.norm_eps, "MaskedLMConfig.norm_eps")


class MaskedLMHead(nn.Module):
    """(..., D) token states and the (V, D) embedding table -> (..., V) logits."""

    def __init__(self, config: MaskedLMConfig) -> None:
        super().__init__()
        self.config = config
        self.dense = nn.Linear(config.d_model, config.d_model, bias=config.dense_bias)
        self.act = CLASSIFIER_ACTIVATIONS[config.activation]
        self.norm = nn.LayerNorm(config.d_model, eps=config.norm_eps, bias=config.norm_bias)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size)) if config.decoder_bias else None

    def forward(self, hidden: Tensor, embedding: Tensor) -> Tensor:
        """Args: hidden (..., D); embedding (V, D), the model's word-embedding table.

        Returns: (..., V) logits."""
        if tuple(embedding.shape) != (self.config.vocab_size, self.config.d_model):
            raise ValueError(
                f"embedding must have shape (vocab_size, d_model) = ({self.config.vocab_size}, "
                f"{self.config.d_model}), got {tuple(embedding.shape)}"
            )
        return nn.functional.linear(self.transform(hidden), embedding, self.bias)  # (..., V)

    def transform(self, hidden: Tensor) -> Tensor:
        """The head before its vocabulary projection: dense, activation, norm; (..., D)."""
        return self.norm(self.act(self.dense(hidden)))
