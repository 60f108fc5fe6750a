"""The trace of one forward pass, and its JSON form.

JSON schema ``clearformer.explain.trace``, version ``SCHEMA_VERSION`` (documented in
``docs/explain.md``). A new field may appear within a version; renaming or removing one, or
changing its meaning, bumps the version. Tensors become nested lists, floats keep 6 significant
digits, and the keys always come in the same order, so two runs on the same input give the
same text.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from .source import Source

SCHEMA = "clearformer.explain.trace"
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Stats:
    """Summary of a tensor over the entries that take part (real tokens, unmasked keys)."""

    mean: float
    std: float
    min: float
    max: float
    norm: float  # Euclidean (Frobenius) norm of those entries
    count: int  # how many entries were summarised

    def to_dict(self) -> dict:
        return {
            "mean": _num(self.mean),
            "std": _num(self.std),
            "min": _num(self.min),
            "max": _num(self.max),
            "norm": _num(self.norm),
            "count": self.count,
        }


@dataclass
class Step:
    """One recorded step of the forward pass."""

    index: int
    name: str  # the record point, e.g. "attn.scores"
    layer: int | None  # block index; None for embeddings, final norm and pooling
    title: str
    formula: str  # plain text
    latex: str
    about: str
    source: Source
    shape: tuple[int, ...]
    dims: tuple[str, ...]  # named dimensions, same length as shape
    stats: Stats
    token_norms: Tensor | None = None  # (B, T) ‖x_t‖₂ for (B, T, D) steps

    def to_dict(self) -> dict:
        return {
            "index": self.index,
            "name": self.name,
            "layer": self.layer,
            "title": self.title,
            "formula": {"text": self.formula, "latex": self.latex},
            "about": self.about,
            "source": self.source.to_dict(),
            "shape": list(self.shape),
            "dims": list(self.dims),
            "stats": self.stats.to_dict(),
            "token_norms": _nested(self.token_norms),
        }


@dataclass
class LayerAttention:
    """The attention of one block, from the reference path.

    Attributes:
        weights: (B, H, Tq, Tk) float32 probabilities; masked keys hold exactly 0.
        mask: (B, H, Tq, Tk) bool, True = the key takes part; None when nothing is masked.
        lost_keys: (B, H, Tq) int64, how many keys each query lost to the mask.
    """

    layer: int
    weights: Tensor
    mask: Tensor | None
    lost_keys: Tensor

    def to_dict(self) -> dict:
        return {
            "layer": self.layer,
            "weights": _nested(self.weights),
            "mask": None if self.mask is None else self.mask.int().tolist(),
            "lost_keys": self.lost_keys.tolist(),
        }


@dataclass(frozen=True)
class Fidelity:
    """How far the traced output is from the production output on the same input."""

    production: str  # the production path, in words
    traced: str  # the path the trace ran
    switched: bool  # the trace ran another path than production
    max_abs_diff: float
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.max_abs_diff <= self.tolerance

    def to_dict(self) -> dict:
        return {
            "production": self.production,
            "traced": self.traced,
            "switched": self.switched,
            "max_abs_diff": _num(self.max_abs_diff),
            "tolerance": self.tolerance,
            "ok": self.ok,
        }


@dataclass
class Trace:
    """Everything :func:`clearformer.explain` recorded.

    Attributes:
        model: facts about the model (kind, n_layers, n_heads, d_model, head_dim, dim_mlp,
            norm, activation, final_norm, pooling, normalize).
        tokens: (B, T) labels of the positions (word pieces, ids or ``t0``...).
        token_mask: (B, T) bool, True = real token.
        texts: the input texts, when the model was given texts.
        truncated: per sequence, whether its text was cut to the model's limit.
        notes: what the reader should know (backend switch, truncation, eval mode).
        steps: the recorded steps in execution order.
        attention: per block, the attention weights, mask and keys lost.
        output: (B, T, D) the traced run's hidden states (zero at padding).
        pooled: (B, D) the sentence embeddings, for text encoders.
        fidelity: traced vs production output.
    """

    model: dict[str, Any]
    tokens: list[list[str]]
    token_mask: Tensor
    texts: list[str] | None
    truncated: list[bool]
    notes: list[str]
    steps: list[Step]
    attention: list[LayerAttention]
    output: Tensor
    pooled: Tensor | None
    fidelity: Fidelity
    output_stats: Stats | None = field(default=None)

    @property
    def n_layers(self) -> int:
        return int(self.model["n_layers"])

    @property
    def n_heads(self) -> int:
        return int(self.model["n_heads"])

    def steps_for(self, layer: int | None) -> list[Step]:
        return [s for s in self.steps if s.layer == layer]

    def to_dict(self) -> dict:
        return {
            "schema": SCHEMA,
            "version": SCHEMA_VERSION,
            "model": self.model,
            "inputs": {
                "batch": int(self.token_mask.shape[0]),
                "length": int(self.token_mask.shape[1]),
                "texts": self.texts,
                "tokens": self.tokens,
                "mask": self.token_mask.int().tolist(),
                "truncated": self.truncated,
            },
            "notes": self.notes,
            "fidelity": self.fidelity.to_dict(),
            "steps": [s.to_dict() for s in self.steps],
            "attention": [a.to_dict() for a in self.attention],
            "output": {
                "shape": list(self.output.shape),
                "dims": ["B", "T", "D"],
                "stats": None if self.output_stats is None else self.output_stats.to_dict(),
            },
            "pooled": _nested(self.pooled),
        }

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent, ensure_ascii=False, allow_nan=False)


def _num(x: float) -> float | None:
    """A JSON-safe float with 6 significant digits (None for NaN or infinity)."""
    x = float(x)
    if not math.isfinite(x):
        return None
    return float(f"{x:.6g}")


def _nested(t: Tensor | None) -> list | None:
    if t is None:
        return None
    # Non-finite values cannot be written as JSON numbers; _num turns them into null.
    return _map(t.detach().float().cpu().tolist())


def _map(obj):
    if isinstance(obj, list):
        return [_map(v) for v in obj]
    return _num(obj)
