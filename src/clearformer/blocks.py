"""The encoder block: attention and a feed-forward network, each inside a residual connection.

Two norm placements, written as two separate paths:

* pre-norm (Xiong et al., 2020)::

    x = x + Dropout(Attn(Norm1(x)))
    x = x + Dropout(FFN(Norm2(x)))

  with branch norms (Gemma3), each branch's output normed before its add::

    x = x + Dropout(NormA(Attn(Norm1(x))))
    x = x + Dropout(NormF(FFN(Norm2(x))))

* post-norm (Vaswani et al., 2017; BERT)::

    x = Norm1(x + Dropout(Attn(x)))
    x = Norm2(x + Dropout(FFN(x)))

In pre-norm the residual stream carries the raw input through every block, so gradients reach
early layers undiminished and no learning-rate warm-up is needed; a pre-norm stack therefore
ends with one final norm (see :class:`clearformer.encoder.Encoder`).
"""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor, nn

from .attention import MultiHeadAttention
from .checks import (
    check_bool,
    check_choice,
    check_divisible,
    check_positive_float,
    check_positive_int,
    check_probability,
)
from .dropout import Dropout
from .dtypes import check_rows_dtype
from .feedforward import FeedForward
from .forward_plan import LayerPlan
from .norms import make_norm
from .options import ACTIVATIONS, BACKENDS, NORM_KINDS, NORMS
from .plan_lone import plan_layer


class BlockOutput(NamedTuple):
    """What one block returns to its stack: the new rows and, on request, the attention
    probabilities (B, H, T, T) of the ``math`` kernel.

    A NamedTuple rather than a dataclass: FSDP2 hooks the tensors of a module's output (to
    gather the module's parameters again before their backward), and the FSDP2 of older torch
    versions (this package supports 2.4 on) finds them with ``tree_flatten``, which walks
    tuples but not dataclasses.
    """

    hidden: Tensor
    attention: Tensor | None


class EncoderBlock(nn.Module):
    """One Transformer encoder block.

    Args:
        d_model: width D of the input and output.
        n_heads: attention heads (D must be divisible by it).
        dim_mlp: hidden width of the feed-forward network.
        dropout: dropout after attention and after the feed-forward network.
        norm: ``"pre"`` or ``"post"``.
        activation: ``relu``, ``gelu`` (exact), ``gelu_tanh``, ``swiglu``, ``geglu`` or
            ``geglu_tanh``.
        attn_dropout: dropout on attention probabilities; default ``dropout``.
        norm_eps: every norm's epsilon (BERT uses 1e-12).
        bias: biases in every linear layer and LayerNorm.
        backend: attention backend, see :class:`clearformer.attention.MultiHeadAttention`.
        attn_norm: False: no norm before attention (pre-norm only; ModernBERT's layer 0).
        n_kv_heads: key/value heads (grouped-query attention); default ``n_heads``.
        head_dim: each head's width; default ``d_model / n_heads``.
        attn_scale: the scores' scale; default ``head_dim ** -0.5``.
        qk_norm: a norm of each head's queries and keys (``attn.q_norm``, ``attn.k_norm``).
        norm_kind: ``layer`` (LayerNorm) or ``rms`` (RMSNorm) for every norm of the block.
        norm_unit_offset: RMSNorm scaled by ``1 + weight`` (Gemma).
        branch_norm: pre-norm only: norms on the branches' outputs (``attn_out_norm``,
            ``mlp_out_norm``) before the residual adds (Gemma3).

    Parameters (the names a checkpoint's weights map to): ``attn_norm``, ``attn`` (``in_proj``:
    query, key, value rows; ``out_proj``; ``q_norm``, ``k_norm``), ``attn_out_norm``,
    ``mlp_norm``, ``mlp`` (``fc_in``: gate rows then value rows when gated; ``fc_out``),
    ``mlp_out_norm``. Absent norms are identities without parameters.
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
        attn_norm: bool = True,
        n_kv_heads: int | None = None,
        head_dim: int | None = None,
        attn_scale: float | None = None,
        qk_norm: bool = False,
        norm_kind: str = "layer",
        norm_unit_offset: bool = False,
        branch_norm: bool = False,
    ) -> None:
        super().__init__()
        for value, name in ((d_model, "d_model"), (n_heads, "n_heads"), (dim_mlp, "dim_mlp")):
            check_positive_int(value, name)
        check_positive_int(head_dim, "head_dim", optional=True)
        if head_dim is None:
            check_divisible(d_model, n_heads, "d_model", "n_heads")
            head_dim = d_model // n_heads
        check_choice(norm_kind, NORM_KINDS, "norm_kind")
        for value, name in ((qk_norm, "qk_norm"), (branch_norm, "branch_norm")):
            check_bool(value, name)
        if branch_norm and norm != "pre":
            raise ValueError(f"branch_norm=True needs norm='pre', got norm={norm!r}")
        check_probability(dropout, "dropout")
        check_probability(attn_dropout, "attn_dropout", optional=True)
        check_positive_float(norm_eps, "norm_eps")
        self.norm = check_choice(norm, NORMS, "norm")
        if not attn_norm and norm == "post":
            raise ValueError(
                "attn_norm=False needs norm='pre': a post-norm block's norm is its output"
            )
        check_choice(activation, ACTIVATIONS, "activation")
        self._backend = check_choice(backend, BACKENDS, "backend")
        self.d_model, self.head_dim, self.branch_norm = d_model, head_dim, branch_norm
        attn_dropout = dropout if attn_dropout is None else attn_dropout

        def norm_of(width: int) -> nn.Module:
            return make_norm(norm_kind, width, norm_eps, bias=bias, unit_offset=norm_unit_offset)

        # ModernBERT's first layer has no attention norm: its input is the normed embeddings.
        self.attn_norm = norm_of(d_model) if attn_norm else nn.Identity()
        width = n_heads * head_dim  # the attention's inner width, D unless head_dim says
        self.attn = MultiHeadAttention(
            d_model,
            width,
            width,
            d_model,
            n_heads,
            attn_dropout,
            bias=bias,
            n_kv_heads=n_kv_heads,
            scale=attn_scale,
            q_norm=norm_of(head_dim) if qk_norm else None,
            k_norm=norm_of(head_dim) if qk_norm else None,
        )
        self.attn_out_norm = norm_of(d_model) if branch_norm else nn.Identity()
        self.attn_residual_dropout = Dropout(dropout)
        self.mlp_norm = norm_of(d_model)
        self.mlp = FeedForward(d_model, dim_mlp, activation, bias=bias)
        self.mlp_out_norm = norm_of(d_model) if branch_norm else nn.Identity()
        self.mlp_residual_dropout = Dropout(dropout)

    @property
    def backend(self) -> str:
        """The backend of a lone call that names none (read-only: a call chooses with
        ``backend=``; inside a stack the stack's plan decides)."""
        return self._backend

    def plan_for(
        self, x: Tensor, mask: Tensor | None = None, *, backend: str | None = None
    ) -> LayerPlan:
        """The plan of a lone call on ``x`` (B, T, D): validated mask, kernel and why."""
        self._check_input(x)
        B, T, _ = x.shape
        return plan_layer(
            mask,
            batch=B,
            heads=self.attn.n_heads,
            tq=T,
            tk=T,
            device=x.device,
            backend=self._backend if backend is None else backend,
            dtype=x.dtype,
            head_dim=self.head_dim,
            grouped=self.attn.kv_heads != self.attn.n_heads,
            dropout=self.training and self.attn.attn_dropout > 0.0,
            rows_apart=self.attn.q_norm is not None,
        )

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        *,
        backend: str | None = None,
        plan: LayerPlan | None = None,
        stacked: bool = False,
        bias: Tensor | None = None,
    ) -> Tensor | BlockOutput:
        """Encode ``x``.

        Args:
            x: (B, T, D); or (N, D) packed rows when ``plan`` is a packed plan.
            mask: bool, True = takes part: (B, T) key padding, or (B, T, T) / (B, H, T, T).
            backend: this call's attention backend; default the block's.
            plan: a plan made by a stack for this call (then no mask or backend here).
            stacked: the call of a stack (:meth:`Encoder.run`): ``x`` and ``plan`` come from
                the stack's edge, which checked them, and the result is the whole
                :class:`BlockOutput`. The stack calls its blocks through ``__call__`` this way,
                not :meth:`run`, so that module hooks fire per block (FSDP2 gathers a block's
                parameters in one; activation checkpointing recomputes the call).
            bias: a stack's call: its (H, L, L) score bias (a relative position bias), or None.

        Returns:
            Same shape as ``x``. Rows at padded positions are computed like any other query
            (they attend to the real keys); :class:`~clearformer.encoder.Encoder` zeroes them.
            With ``stacked``: a :class:`BlockOutput`.
        """
        if stacked:
            if plan is None or mask is not None or backend is not None:
                raise ValueError("stacked=True takes a stack's plan, and no mask or backend")
            return self.run(x, plan, bias)
        if plan is None:
            # Checked here, before the pre-norm runs, so that a bad mask fails before any work.
            plan = self.plan_for(x, mask, backend=backend)
        else:
            if mask is not None or backend is not None:
                raise ValueError("give either a plan or mask/backend, not both")
            plan.check_rows(x)
        return self.run(x, plan).hidden

    def run(self, x: Tensor, plan: LayerPlan, bias: Tensor | None = None) -> BlockOutput:
        """One block on rows laid out as ``plan`` says (``bias``: the stack call's score bias);
        the plan is trusted as it is."""
        if plan.fused_linear:
            # A fast route the plan chose (clearformer.fast) runs the whole block on this
            # block's own parameters: each residual add and norm fused into a matrix product.
            return BlockOutput(*plan.linear.impl.encoder_block(self, x, plan, bias))
        if self.norm == "pre":
            h = self.attn_norm(x)
            h, weights = self.attn.attend(h, h, h, plan, bias)
            x = x + self.attn_residual_dropout(self.attn_out_norm(h))
            x = x + self.mlp_residual_dropout(self.mlp_out_norm(self.mlp(self.mlp_norm(x))))
        else:
            h, weights = self.attn.attend(x, x, x, plan, bias)
            x = self.attn_norm(x + self.attn_residual_dropout(h))
            x = self.mlp_norm(x + self.mlp_residual_dropout(self.mlp(x)))
        return BlockOutput(x, weights)

    def _check_input(self, x: Tensor) -> None:
        if not isinstance(x, Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        check_rows_dtype(x, "x", self)
        if x.dim() != 3:
            raise ValueError(
                f"x must be 3-D (B, T, D) with D={self.d_model}, got shape {tuple(x.shape)}"
            )
        if x.shape[-1] != self.d_model:
            raise ValueError(
                f"x last dim must be d_model={self.d_model}, got {x.shape[-1]} "
                f"(shape {tuple(x.shape)})"
            )

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, norm={self.norm!r}"
