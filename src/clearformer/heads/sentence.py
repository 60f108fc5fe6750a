"""The sentence-embedding head after the encoder: pooling, then sentence-transformers'
``Dense`` and ``Normalize`` modules in their order, then a Matryoshka cut.

sentence-transformers runs its modules one after another on the pooled vector
(``Transformer -> Pooling -> Dense -> ... -> Normalize``); EmbeddingGemma, for one, projects
its 768-wide mean up to 3072 and back to 768 before normalising. :class:`SentenceHead` is that
chain as one module with :class:`SentenceHeadConfig` at its boundary.

A Matryoshka model's first ``d`` values are themselves an embedding. ``dimensions=d`` keeps
them, then L2-normalises when the call normalises: as sentence-transformers'
``encode(truncate_dim=d, normalize_embeddings=True)``, which cuts after the modules and
normalises after the cut. (Its ``Normalize`` module runs before the cut, so with
``normalize_embeddings=False`` it returns the first ``d`` values of a unit vector: the same
direction, a smaller length.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..checks import ArgumentTypeError, check_bool, check_choice, check_positive_int
from .pooling import POOLING_MODES, pool
from .rowwise import each_row

__all__ = ["DENSE_ACTIVATIONS", "DenseConfig", "SentenceHead", "SentenceHeadConfig"]

# The element-wise functions a Dense module may apply after its linear layer, by name.
DENSE_ACTIVATIONS = {
    "identity": lambda x: x,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "relu": F.relu,
    "gelu": F.gelu,  # exact (erf), torch.nn.GELU's default
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
}


@dataclass(frozen=True)
class DenseConfig:
    """One Dense step: ``act(linear(x))``, plus ``x`` (or ``residual(x)`` where the widths
    differ) when ``residual``. (B, in_features) -> (B, out_features)."""

    in_features: int
    out_features: int
    bias: bool = True
    activation: str = "tanh"  # sentence-transformers' default; EmbeddingGemma's: identity
    residual: bool = False

    def __post_init__(self) -> None:
        check_positive_int(self.in_features, "DenseConfig.in_features")
        check_positive_int(self.out_features, "DenseConfig.out_features")
        check_bool(self.bias, "DenseConfig.bias")
        check_bool(self.residual, "DenseConfig.residual")
        check_choice(self.activation, tuple(DENSE_ACTIVATIONS), "DenseConfig.activation")


# A step after pooling: a Dense layer, or "normalize" (an L2 normalisation between them).
Step = DenseConfig | str


@dataclass(frozen=True)
class SentenceHeadConfig:
    """Pooling and the modules after it.

    Attributes:
        d_model: width D of the token states.
        pooling: one of :data:`~clearformer.heads.POOLING_MODES`.
        steps: Dense layers (:class:`DenseConfig`) and ``"normalize"`` steps, in order, after
            the pooling; a trailing Normalize is not a step but :attr:`normalize`.
        normalize: whether calls normalise by default (the modules end in Normalize).
        matryoshka_dimensions: the widths the model was trained to be cut to; empty = any.
    """

    d_model: int
    pooling: str = "mean"
    steps: tuple[Step, ...] = ()
    normalize: bool = False
    matryoshka_dimensions: tuple[int, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        check_positive_int(self.d_model, "SentenceHeadConfig.d_model")
        check_choice(self.pooling, POOLING_MODES, "SentenceHeadConfig.pooling")
        check_bool(self.normalize, "SentenceHeadConfig.normalize")
        width = self.d_model
        for i, step in enumerate(self.steps):
            if step == "normalize":
                continue
            if not isinstance(step, DenseConfig):
                raise TypeError(
                    f"SentenceHeadConfig.steps[{i}] must be a DenseConfig or 'normalize', "
                    f"got {step!r}"
                )
            if step.in_features != width:
                raise ValueError(
                    f"SentenceHeadConfig.steps[{i}].in_features must be {width} (the width "
                    f"before it), got {step.in_features}"
                )
            width = step.out_features
        for i, dims in enumerate(self.matryoshka_dimensions):
            check_positive_int(dims, f"SentenceHeadConfig.matryoshka_dimensions[{i}]")
            if dims > width:
                raise ValueError(
                    f"SentenceHeadConfig.matryoshka_dimensions[{i}] must be at most the "
                    f"embedding width {width}, got {dims}"
                )

    @property
    def width(self) -> int:
        """Width of the embeddings: the last Dense layer's, else D."""
        dense = [s for s in self.steps if isinstance(s, DenseConfig)]
        return dense[-1].out_features if dense else self.d_model


class Dense(nn.Module):
    """sentence-transformers' Dense module (parameter names as its ``model.safetensors``:
    ``linear.weight``, ``linear.bias``, ``residual.weight``)."""

    def __init__(self, config: DenseConfig) -> None:
        super().__init__()
        self.config = config
        self.linear = nn.Linear(config.in_features, config.out_features, bias=config.bias)
        self.act = DENSE_ACTIVATIONS[config.activation]
        self.residual = (
            nn.Linear(config.in_features, config.out_features, bias=False)
            if config.residual and config.in_features != config.out_features
            else None
        )

    def forward(self, x: Tensor) -> Tensor:
        """(B, in_features) -> (B, out_features)."""
        out = self.act(self.linear(x))
        if self.config.residual:
            out = out + (x if self.residual is None else self.residual(x))
        return out


class SentenceHead(nn.Module):
    """(B, T, D) token states + (B, T) mask -> (B, width) sentence embeddings."""

    def __init__(self, config: SentenceHeadConfig) -> None:
        super().__init__()
        self.config = config
        # Index i of ``dense`` is step i's layer; a "normalize" step holds an Identity there,
        # so parameter names (dense.<i>.linear.weight) follow the module order.
        self.dense = nn.ModuleList(
            Dense(step) if isinstance(step, DenseConfig) else nn.Identity() for step in config.steps
        )

    @property
    def width(self) -> int:
        return self.config.width

    def check_dimensions(self, dimensions: int | None, name: str = "dimensions") -> None:
        """Refuse a cut wider than the embeddings or outside the model's Matryoshka widths."""
        if dimensions is None:
            return
        if isinstance(dimensions, bool) or not isinstance(dimensions, int):
            raise ArgumentTypeError(f"{name} must be a positive int or None, got {dimensions!r}")
        if not 1 <= dimensions <= self.width:
            raise ValueError(
                f"{name} must be in [1, {self.width}] (the embedding width), got {dimensions}"
            )
        allowed = self.config.matryoshka_dimensions
        if allowed and dimensions not in allowed:
            raise ValueError(
                f"{name} must be one of the model's Matryoshka dimensions {sorted(allowed)}, "
                f"got {dimensions}"
            )

    def forward(
        self,
        hidden: Tensor,
        attention_mask: Tensor,
        *,
        skip: int = 0,
        normalize: bool | None = None,
        dimensions: int | None = None,
    ) -> Tensor:
        """Pool, run the steps, keep the first ``dimensions`` values, normalise.

        Args:
            hidden: (B, T, D) token states.
            attention_mask: (B, T) bool, True = real token.
            skip: leading tokens (a prompt's) the pooling leaves out.
            normalize: L2-normalise the result; None = :attr:`SentenceHeadConfig.normalize`.
            dimensions: keep the first this many values (checked by :meth:`check_dimensions`).

        Returns:
            (B, dimensions or width).
        """
        normalize = self.config.normalize if normalize is None else normalize
        vectors = pool(hidden, attention_mask, self.config.pooling, skip=skip)  # (B, D)
        for step, layer in zip(self.config.steps, self.dense, strict=True):
            # A Dense maps (B, in) -> (B, out); a Normalize step keeps the width.
            if step == "normalize":
                vectors = F.normalize(vectors, p=2.0, dim=-1)
            else:
                vectors = each_row(layer, vectors)
        if dimensions is not None:
            vectors = vectors[:, :dimensions]  # (B, dimensions)
        if normalize:
            vectors = F.normalize(vectors, p=2.0, dim=-1)
        return vectors


def head_steps(kinds: Sequence[Step]) -> tuple[tuple[Step, ...], bool]:
    """(steps, normalize): a module list after pooling with its trailing Normalize taken out
    as the default of calls (so ``normalize=False`` can switch it off)."""
    steps = list(kinds)
    normalize = bool(steps) and steps[-1] == "normalize"
    if normalize:
        steps.pop()
    return tuple(steps), normalize
