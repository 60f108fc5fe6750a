"""The norms of a stack: LayerNorm (BERT) or RMSNorm (Qwen3, Gemma), one kind per model.

``make_norm`` builds the kind a configuration names, so every place that norms rows (the
blocks, the final norm, the embeddings, the per-head query and key norms) builds the same kind
with the same epsilon. RMSNorm's math is :func:`clearformer.reference.rms_norm`.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from . import reference
from .checks import check_choice, check_positive_float, check_positive_int
from .options import NORM_KINDS

__all__ = ["RMSNorm", "make_norm"]


class RMSNorm(nn.Module):
    """Root-mean-square norm (Zhang and Sennrich, 2019) over the last ``width`` features:
    ``x / sqrt(mean(x²) + eps)``, scaled by ``weight`` or, with ``unit_offset`` (Gemma), by
    ``1 + weight``. No centring and no bias. (..., width) -> (..., width).

    Its one parameter is ``weight`` (width,): ones at start, or zeros with ``unit_offset``, so
    that a new norm is the identity scaling either way; a checkpoint's weight loads as it is.
    """

    def __init__(self, width: int, eps: float = 1e-6, *, unit_offset: bool = False) -> None:
        super().__init__()
        check_positive_int(width, "width")
        check_positive_float(eps, "eps")
        self.normalized_shape = (width,)
        self.eps = eps
        self.unit_offset = bool(unit_offset)
        self.weight = nn.Parameter(torch.zeros(width) if unit_offset else torch.ones(width))

    def forward(self, x: Tensor) -> Tensor:
        return reference.rms_norm(self, x)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, unit_offset={self.unit_offset}"


def make_norm(
    kind: str, width: int, eps: float, *, bias: bool = True, unit_offset: bool = False
) -> nn.Module:
    """A norm over ``width`` features: ``nn.LayerNorm`` (``kind="layer"``, with a bias unless
    ``bias=False``) or :class:`RMSNorm` (``kind="rms"``, never a bias)."""
    check_choice(kind, NORM_KINDS, "norm_kind")
    if kind == "rms":
        return RMSNorm(width, eps, unit_offset=unit_offset)
    if unit_offset:
        raise ValueError("unit_offset=True scales an RMSNorm and needs kind='rms', got 'layer'")
    return nn.LayerNorm(width, eps=eps, bias=bias)
