"""The position-wise feed-forward network and its activations.

Plain: ``fc_out(act(fc_in(x)))``. Gated (GLU family, Shazeer 2020): ``fc_in`` produces two halves,
a gate and a value; ``fc_out(act(gate) * value)``. ``swiglu`` uses SiLU, ``geglu`` exact GELU.
"""

from __future__ import annotations

from torch import Tensor, nn

from .activations import activation_fn
from .checks import check_choice, check_positive_int
from .fused_linear import linear, residual_then_norm
from .options import ACTIVATIONS, GATED_ACTIVATIONS
from .tracing import record

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

    def forward(
        self,
        x: Tensor,
        *,
        fused: bool = False,
        residual: Tensor | None = None,
        norm: nn.Module | None = None,
    ) -> Tensor:
        """(..., D) -> (..., D), plus ``residual`` when given, then ``norm`` when given (a
        post-norm block's LayerNorm, fused into the second product where a kernel can).

        ``fused``: run the linear layers with their bias, activation and the residual add
        fused into the matrix products (:mod:`clearformer.fused_linear`; CPU inference only,
        records nothing for ``explain``). The forward plan decides it per call.
        """
        if fused:
            if self.gated:
                gate, value = linear(x, self.fc_in, fused=True).chunk(2, dim=-1)
                h = self.act(gate) * value  # (..., dim_mlp)
            else:
                h = linear(x, self.fc_in, fused=True, activation=self.activation)
            return linear(h, self.fc_out, fused=True, residual=residual, norm=norm)
        h = self.fc_in(x)  # (..., dim_mlp) or (..., 2 * dim_mlp) when gated
        record("ffn.hidden", h)
        if self.gated:
            gate, value = h.chunk(2, dim=-1)  # two (..., dim_mlp) halves
            h = self.act(gate) * value
        else:
            h = self.act(h)
        record("ffn.activation", h)
        out = self.fc_out(h)  # (..., D)
        record("ffn.output", out)
        return residual_then_norm(out, residual, norm)

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"
