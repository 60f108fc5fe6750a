"""The position-wise feed-forward network and its activations.

Plain: ``fc_out(act(fc_in(x)))``. Gated (GLU family, Shazeer 2020): ``fc_in`` produces two halves,
a gate and a value; ``fc_out(act(gate) * value)``. ``swiglu`` uses SiLU, ``geglu`` exact GELU.
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
