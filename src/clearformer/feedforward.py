"""The position-wise feed-forward network and its activations.

Plain: ``fc_out(act(fc_in(x)))``. Gated (GLU family, Shazeer 2020): ``fc_in`` produces two halves,
a gate and a value; ``fc_out(act(gate) * value)``. ``swiglu`` uses SiLU (Llama, Qwen3), ``geglu``
exact GELU (ModernBERT), ``geglu_tanh`` the tanh GELU (Gemma's ``gelu_pytorch_tanh``).

Gated layout: ``fc_in.weight`` is ``(2 * dim_mlp, D)``, the gate's rows first, then the value's.
A checkpoint with separate ``gate_proj`` and ``up_proj`` maps to
``torch.cat([gate_proj.weight, up_proj.weight])``; ``fc_out`` is its ``down_proj``.
"""

from __future__ import annotations

from torch import Tensor, nn

from . import reference
from .activations import activation_fn
from .checks import check_choice, check_positive_int
from .options import ACTIVATIONS, GATED_ACTIVATIONS

__all__ = ["FeedForward", "activation_fn"]


class FeedForward(nn.Module):
    """Position-wise feed-forward network: (..., D) -> (..., D).

    Args:
        d_model: input and output width D.
        dim_mlp: hidden width.
        activation: one of ``ACTIVATIONS``.
        bias: biases on both linear layers.
    """

    def __init__(self, d_model: int, dim_mlp: int, activation: str = "relu", bias: bool = True):
        super().__init__()
        check_positive_int(d_model, "d_model")
        check_positive_int(dim_mlp, "dim_mlp")
        self.activation = check_choice(activation, ACTIVATIONS, "activation")
        self.gated = activation in GATED_ACTIVATIONS
        self.act = activation_fn(activation)
        self.fc_in = nn.Linear(d_model, 2 * dim_mlp if self.gated else dim_mlp, bias=bias)
        self.fc_out = nn.Linear(dim_mlp, d_model, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        """(..., D) -> (..., D): :func:`clearformer.reference.feed_forward` on this module."""
        return reference.feed_forward(self, x)

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"
