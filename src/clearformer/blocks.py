"""The encoder block: attention and a feed-forward network, each inside a residual connection.

Two norm placements, written as two separate paths:

* pre-norm (Xiong et al., 2020)::

    x = x + Dropout(Attn(Norm1(x)))
    x = x + Dropout(FFN(Norm2(x)))

* post-norm (Vaswani et al., 2017; BERT)::

    x = Norm1(x + Dropout(Attn(x)))
    x = Norm2(x + Dropout(FFN(x)))

In pre-norm the residual stream carries the raw input through every block, so gradients reach
early layers undiminished and no learning-rate warm-up is needed; a pre-norm stack therefore
ends with one final norm (see :class:`clearformer.encoder.Encoder`).
"""

from __future__ import annotations

from torch import Tensor, nn

from .attention import MultiHeadAttention
from .feedforward import FeedForward, check_activation
from .masks import prepare_attention_mask
from .padding import PackedLayout
from .tracing import record

NORMS = ("pre", "post")


def check_norm(norm: str, name: str = "norm") -> str:
    if norm not in NORMS:
        raise ValueError(f"{name} must be one of {NORMS}, got {norm!r}")
    return norm


class EncoderBlock(nn.Module):
    """One Transformer encoder block.

    Args:
        d_model: width D of the input and output.
        n_heads: attention heads (D must be divisible by it).
        dim_mlp: hidden width of the feed-forward network.
        dropout: dropout after attention and after the feed-forward network.
        norm: ``"pre"`` or ``"post"``.
        activation: ``relu``, ``gelu`` (exact), ``gelu_tanh``, ``swiglu`` or ``geglu``.
        attn_dropout: dropout on attention probabilities; default ``dropout``.
        norm_eps: LayerNorm epsilon (BERT uses 1e-12).
        bias: biases in every linear layer and norm.
        backend: attention backend, see :class:`clearformer.attention.MultiHeadAttention`.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dim_mlp: int,
        dropout: float = 0.0,
        *,
        norm: str = "pre",
        activation: str = "relu",
        attn_dropout: float | None = None,
        norm_eps: float = 1e-5,
        bias: bool = True,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        if not isinstance(d_model, int) or d_model <= 0:
            raise ValueError(f"d_model must be a positive int, got {d_model!r}")
        if not isinstance(n_heads, int) or n_heads <= 0:
            raise ValueError(f"n_heads must be a positive int, got {n_heads!r}")
        if d_model % n_heads != 0:
            raise ValueError(
                f"d_model must be divisible by n_heads: d_model={d_model}, n_heads={n_heads}"
            )
        if not isinstance(dim_mlp, int) or dim_mlp <= 0:
            raise ValueError(f"dim_mlp must be a positive int, got {dim_mlp!r}")
        if not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
            kind = ValueError if isinstance(dropout, (int, float)) else TypeError
            raise kind(f"dropout must be a float in [0, 1), got {dropout!r}")
        if not isinstance(norm_eps, (int, float)) or not norm_eps > 0:
            raise ValueError(f"norm_eps must be a float > 0, got {norm_eps!r}")
        self.norm = check_norm(norm)
        check_activation(activation)
        self.d_model = d_model
        attn_dropout = dropout if attn_dropout is None else attn_dropout

        self.attn_norm = nn.LayerNorm(d_model, eps=norm_eps, bias=bias)
        self.attn = MultiHeadAttention(
            d_model, d_model, d_model, d_model, n_heads, attn_dropout, bias=bias, backend=backend
        )
        self.attn_residual_dropout = nn.Dropout(dropout)
        self.mlp_norm = nn.LayerNorm(d_model, eps=norm_eps, bias=bias)
        self.mlp = FeedForward(d_model, dim_mlp, activation, bias=bias)
        self.mlp_residual_dropout = nn.Dropout(dropout)

    def forward(
        self, x: Tensor, mask: Tensor | None = None, *, layout: PackedLayout | None = None
    ) -> Tensor:
        """Encode ``x``.

        Args:
            x: (B, T, D); or (N, D) packed rows when ``layout`` is given.
            mask: bool, True = takes part: (B, T) key padding, or (B, T, T) / (B, H, T, T).
            layout: where each packed sequence starts (see :mod:`clearformer.padding`).

        Returns:
            Same shape as ``x``. Rows at padded positions are computed like any other query
            (they attend to the real keys); :class:`~clearformer.encoder.Encoder` zeroes them.
        """
        self._check_input(x, mask, layout)
        record("block.input", x)
        if self.norm == "pre":
            x = x + self.attn_residual_dropout(self._attend(self.attn_norm(x), mask, layout))
            record("block.attn_residual", x)
            x = x + self.mlp_residual_dropout(self._feed_forward(self.mlp_norm(x)))
            record("block.mlp_residual", x)
        else:
            x = self.attn_norm(x + self.attn_residual_dropout(self._attend(x, mask, layout)))
            record("block.attn_residual", x)
            x = self.mlp_norm(x + self.mlp_residual_dropout(self._feed_forward(x)))
            record("block.mlp_residual", x)
        return x

    def _attend(self, h: Tensor, mask: Tensor | None, layout: PackedLayout | None) -> Tensor:
        record("block.attn_input", h)
        out, _ = self.attn(h, h, h, mask, layout=layout)
        return out

    def _feed_forward(self, h: Tensor) -> Tensor:
        record("block.mlp_input", h)
        return self.mlp(h)

    def _check_input(self, x: Tensor, mask: Tensor | None, layout: PackedLayout | None) -> None:
        if not isinstance(x, Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        want = 2 if layout is not None else 3
        if x.dim() != want:
            form = "(N, D) packed rows" if layout is not None else "(B, T, D)"
            raise ValueError(
                f"x must be {want}-D {form} with D={self.d_model}, got shape {tuple(x.shape)}"
            )
        if x.shape[-1] != self.d_model:
            raise ValueError(
                f"x last dim must be d_model={self.d_model}, got {x.shape[-1]} "
                f"(shape {tuple(x.shape)})"
            )
        if layout is None:
            # Attention checks the mask too, but only after the pre-norm has run: check it here
            # so that a bad mask fails before any work.
            B, T, _ = x.shape
            prepare_attention_mask(
                mask, batch=B, heads=self.attn.n_heads, tq=T, tk=T, device=x.device
            )

    # -- torch.nn interop ----------------------------------------------------------------------
    @classmethod
    def from_torch(cls, layer: nn.TransformerEncoderLayer, backend: str = "auto") -> EncoderBlock:
        """A block with the same numerics as a ``torch.nn.TransformerEncoderLayer``."""
        from .interop.torch_nn import block_from_torch

        return block_from_torch(layer, backend=backend)

    def to_torch(self) -> nn.TransformerEncoderLayer:
        """A ``torch.nn.TransformerEncoderLayer(batch_first=True)`` with the same numerics."""
        from .interop.torch_nn import block_to_torch

        return block_to_torch(self)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, norm={self.norm!r}"
