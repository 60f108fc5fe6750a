"""Model FLOPs: the multiply-adds the model itself needs, counted on real tokens only.

Per layer and sequence of n tokens: ``2 n P`` for the matrix products with the layer's
``P = 4 D^2 + 2 D F`` weights (Q, K, V, output, two feed-forward matrices), plus ``4 n^2 D``
for attention (scores and the weighted sum). Norms, biases and activations are not counted: they
are the overhead the utilisation figure exposes. A training step counts three times the forward
(the backward needs two products per forward product).
"""

from __future__ import annotations

from collections.abc import Iterable

from .workloads import ModelSize


def layer_weights(size: ModelSize) -> int:
    D, F = size.d_model, size.dim_mlp
    return 4 * D * D + 2 * D * F


def forward_flops(size: ModelSize, lengths: Iterable[int], n_layers: int | None = None) -> float:
    """Forward FLOPs for sequences of the given real lengths (no padding counted)."""
    layers = size.n_layers if n_layers is None else n_layers
    P, D = layer_weights(size), size.d_model
    return float(layers * sum(2 * n * P + 4 * n * n * D for n in lengths))


def step_flops(size: ModelSize, lengths: Iterable[int], training: bool) -> float:
    return forward_flops(size, lengths) * (3.0 if training else 1.0)
