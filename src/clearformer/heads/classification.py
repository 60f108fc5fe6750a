"""The sequence-classification head: one vector per sequence -> ``num_labels`` logits.

Every BERT-family classifier in transformers is the same four steps with different parts:

=========  ===========  ==========================  ==============  ==========================
family     pooled by    dense (D -> D)              activation      then
=========  ===========  ==========================  ==============  ==========================
BERT       first token  ``bert.pooler.dense``       tanh            ``classifier``
RoBERTa    first token  ``classifier.dense``        tanh            ``classifier.out_proj``
DistilBERT first token  ``pre_classifier``          ReLU            ``classifier``
ModernBERT cls or mean  ``head.dense`` (no bias)    GELU, LayerNorm ``classifier``
GTE        first token  ``gte.pooler.dense``        tanh            ``classifier``
Qwen3      last token   none                        none            ``score`` (no bias)
=========  ===========  ==========================  ==============  ==========================

so one module, configured by :class:`ClassifierConfig`, runs them all; the checkpoint families
(:mod:`clearformer.interop.hf.families`) say which parts a checkpoint has and where its tensors
are. Dropout is left out: these heads are for inference (``eval`` mode drops nothing).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .pooling import pool
from .rowwise import each_row

__all__ = ["CLASSIFIER_ACTIVATIONS", "ClassifierConfig", "SequenceClassifier"]

# The activation after the dense layer, by the name transformers' configs use.
CLASSIFIER_ACTIVATIONS = {
    "tanh": torch.tanh,
    "relu": F.relu,
    "gelu": F.gelu,  # exact (erf) GELU, transformers' "gelu"
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_fast": lambda x: F.gelu(x, approximate="tanh"),  # the same tanh form, another name
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
}
_POOLINGS = ("cls", "mean", "lasttoken")


@dataclass(frozen=True)
class ClassifierConfig:
    """The shape of a :class:`SequenceClassifier`.

    Attributes:
        d_model: width D of the encoder's states.
        num_labels: logits per sequence (1 for a relevance score).
        pooling: ``cls`` (first token), ``mean`` (average of the real tokens) or
            ``lasttoken`` (the last real token, whatever the padding side: decoder-born
            classifiers, whose last token has read the whole text).
        dense: whether a dense layer and its activation come before ``out`` (Qwen3: no).
        activation: one of :data:`CLASSIFIER_ACTIVATIONS`, after the dense layer.
        dense_bias: whether the dense layer has a bias.
        norm: whether a LayerNorm follows the activation (ModernBERT).
        norm_eps: its epsilon.
        norm_bias: whether it has a bias.
        labels: the label names, ``labels[i]`` for logit ``i`` (empty: unnamed).
        out_bias: whether ``out`` has a bias (Qwen3's ``score``: no).
    """

    d_model: int
    num_labels: int
    pooling: str = "cls"
    activation: str = "tanh"
    dense_bias: bool = True
    norm: bool = False
    norm_eps: float = 1e-5
    norm_bias: bool = True
    labels: tuple[str, ...] = ()
    dense: bool = True
    out_bias: bool = True

    def __post_init__(self) -> None:
        for name in ("d_model", "num_labels"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.pooling not in _POOLINGS:
            raise ValueError(f"pooling must be one of {_POOLINGS}, got {self.pooling!r}")
        if self.activation not in CLASSIFIER_ACTIVATIONS:
            raise ValueError(
                f"activation must be one of {tuple(CLASSIFIER_ACTIVATIONS)}, got "
                f"{self.activation!r}"
            )
        if self.norm and not self.dense:
            raise ValueError("norm=True needs the dense layer it follows (dense=True)")
        if self.labels and len(self.labels) != self.num_labels:
            raise ValueError(
                f"labels must name each of the num_labels={self.num_labels} logits, got "
                f"{len(self.labels)} names"
            )


class SequenceClassifier(nn.Module):
    """Pool -> (dense -> activation -> (LayerNorm)) -> ``out``: (B, T, D) states -> (B, L)
    logits."""

    def __init__(self, config: ClassifierConfig) -> None:
        super().__init__()
        if not isinstance(config, ClassifierConfig):
            raise TypeError(f"config must be a ClassifierConfig, got {type(config).__name__}")
        self.config = config
        D = config.d_model
        self.dense = nn.Linear(D, D, bias=config.dense_bias) if config.dense else None
        self.norm = (
            nn.LayerNorm(D, eps=config.norm_eps, bias=config.norm_bias) if config.norm else None
        )
        self.out = nn.Linear(D, config.num_labels, bias=config.out_bias)
        self._activation = CLASSIFIER_ACTIVATIONS[config.activation]

    def forward(self, hidden: Tensor, attention_mask: Tensor) -> Tensor:
        """(B, T, D) token states + (B, T) bool mask (True = real token) -> (B, L) logits."""
        x = pool(hidden, attention_mask, self.config.pooling)  # (B, D)
        return each_row(self._after_pooling, x)  # (B, L)

    def _after_pooling(self, x: Tensor) -> Tensor:
        """(b, D) pooled rows -> (b, L) logits."""
        if self.dense is not None:
            x = self._activation(self.dense(x))
        if self.norm is not None:
            x = self.norm(x)
        return self.out(x)
