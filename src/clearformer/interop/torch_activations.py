"""The clearformer name of a ``torch.nn`` layer's activation (shared by the converters)."""

from __future__ import annotations

import functools

import torch.nn.functional as F
from torch import nn


def activation_name(activation) -> str:
    if activation is F.relu or isinstance(activation, nn.ReLU):
        return "relu"
    if activation is F.gelu:
        return "gelu"
    if isinstance(activation, nn.GELU):
        return "gelu" if activation.approximate == "none" else "gelu_tanh"
    if isinstance(activation, functools.partial) and activation.func is F.gelu:
        return "gelu_tanh" if activation.keywords.get("approximate") == "tanh" else "gelu"
    raise ValueError(
        f"activation {activation!r} of the torch.nn layer has no clearformer equivalent; "
        "supported: relu, gelu (exact or tanh)"
    )
