"""Activation functions by name (the feed-forward network's, and the fused linear layers')."""

from __future__ import annotations

import torch.nn.functional as F

from .options import GATED_ACTIVATIONS


def activation_fn(name: str):
    """The element-wise function for an activation name (the gate's for GLU variants)."""
    name = GATED_ACTIVATIONS.get(name, name)
    if name == "relu":
        return F.relu
    if name == "gelu":
        return F.gelu  # exact (erf) GELU, as BERT uses
    if name == "gelu_tanh":
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "silu":
        return F.silu
    raise ValueError(f"unknown activation {name!r}")
