"""The decoder block: causal self-attention, cross-attention over a memory, a feed-forward
network, each inside a residual connection (Vaswani et al., 2017).

Two norm placements, written as two separate paths (as ``torch.nn.TransformerDecoderLayer``):

* pre-norm::

    x = x + Dropout(SelfAttn(Norm1(x)))            # causal: token i sees tokens j <= i
    x = x + Dropout(CrossAttn(Norm2(x), memory))
    x = x + Dropout(FFN(Norm3(x)))

* post-norm::

    x = Norm1(x + Dropout(SelfAttn(x)))
    x = Norm2(x + Dropout(CrossAttn(x, memory)))
    x = Norm3(x + Dropout(FFN(x)))

Converted from ``torch.nn.TransformerDecoderLayer`` by ``clearformer.from_torch`` (the core
imports no converter). Incremental decoding passes a :class:`LayerCache`: the keys and values
of the target tokens decoded so far (self-attention) and of the memory (cross-attention,
computed once per source). The cache is a value, passed in and returned, never stored on the
module.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import MultiHeadAttention
from .checks import (
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
from .options import ACTIVATIONS, BACKENDS, NORMS
from .plan_lone import plan_decoder


@dataclass(frozen=True)
class LayerCache:
    """What one decoder block keeps between decoding steps.

    Attributes:
        keys, values: (B, H, T_past, Dh) self-attention keys and values of the target tokens
            decoded so far (T_past may be 0).
        memory_keys, memory_values: (B, H, S, Dh) cross-attention keys and values of the
            memory, projected once per source.
    """

    keys: Tensor
    values: Tensor
    memory_keys: Tensor
    memory_values: Tensor

    @property
    def length(self) -> int:
        """Target tokens cached so far."""
        return self.keys.shape[2]

    @property
    def batch(self) -> int:
        return self.keys.shape[0]

    @property
    def memory_length(self) -> int:
        return self.memory_keys.shape[2]

    def select(self, rows: Tensor, *, memory: bool = True) -> LayerCache:
        """The cache of batch rows ``rows`` (B',) int64, in that order: beams reselected, or
        finished rows dropped. ``memory=False`` keeps the memory's keys and values as they are
        (beams reordered within their own source share one memory)."""
        mk, mv = self.memory_keys, self.memory_values
        if memory:
            mk, mv = mk.index_select(0, rows), mv.index_select(0, rows)
        return LayerCache(
            self.keys.index_select(0, rows), self.values.index_select(0, rows), mk, mv
        )


class DecoderBlock(nn.Module):
    """One Transformer decoder block.

    Args:
        d_model: width D of the target rows, the memory and the output.
        n_heads: attention heads (D must be divisible by it).
        dim_mlp: hidden width of the feed-forward network.
        dropout: dropout after each attention and after the feed-forward network.
        norm: ``"pre"`` or ``"post"``.
        activation: ``relu``, ``gelu`` (exact), ``gelu_tanh``, ``swiglu`` or ``geglu``.
        attn_dropout: dropout on attention probabilities; default ``dropout``.
        norm_eps: LayerNorm epsilon.
        bias: biases in every linear layer and norm.
        backend: the attention backend of calls that name none (``auto``, ``math``, ``sdpa``;
            the decoder runs on the padded layout).
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
        for value, name in ((d_model, "d_model"), (n_heads, "n_heads"), (dim_mlp, "dim_mlp")):
            check_positive_int(value, name)
        check_divisible(d_model, n_heads, "d_model", "n_heads")
        check_probability(dropout, "dropout")
        check_probability(attn_dropout, "attn_dropout", optional=True)
        check_positive_float(norm_eps, "norm_eps")
        self.norm = check_choice(norm, NORMS, "norm")
        check_choice(activation, ACTIVATIONS, "activation")
        self._backend = check_choice(backend, BACKENDS, "backend")
        if backend == "varlen":
            raise ValueError(
                "backend='varlen' runs on packed rows; the decoder runs on the padded layout: "
                "use 'auto', 'sdpa' or 'math'"
            )
        self.d_model = d_model
        attn_dropout = dropout if attn_dropout is None else attn_dropout
        d = d_model
        self.self_attn_norm = nn.LayerNorm(d, eps=norm_eps, bias=bias)
        self.self_attn = MultiHeadAttention(d, d, d, d, n_heads, attn_dropout, bias=bias)
        self.self_attn_dropout = Dropout(dropout)
        self.cross_attn_norm = nn.LayerNorm(d, eps=norm_eps, bias=bias)
        self.cross_attn = MultiHeadAttention(
            d, d, d, d, n_heads, attn_dropout, bias=bias, cross=True
        )
        self.cross_attn_dropout = Dropout(dropout)
        self.mlp_norm = nn.LayerNorm(d, eps=norm_eps, bias=bias)
        self.mlp = FeedForward(d, dim_mlp, activation, bias=bias)
        self.mlp_dropout = Dropout(dropout)

    @property
    def backend(self) -> str:
        """The backend of a lone call that names none (read-only; a call chooses with
        ``backend=``, and inside a stack the stack's plan decides)."""
        return self._backend

    # -- planning ------------------------------------------------------------------------------
    def start_cache(self, memory: Tensor) -> LayerCache:
        """An empty cache for decoding against ``memory`` (B, S, D): its keys and values are
        projected here, once."""
        mk, mv = memory_kv(self.cross_attn, memory)  # (B, H, S, Dh)
        B, H = memory.shape[0], self.self_attn.n_heads
        empty = memory.new_zeros(B, H, 0, self.d_model // H)
        return LayerCache(empty, empty, mk, mv)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None,
        mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        *,
        cache: LayerCache | None = None,
        backend: str | None = None,
    ) -> Tensor | tuple[Tensor, LayerCache]:
        """Decode ``x`` against ``memory``.

        Args:
            x: (B, T, D) target rows (with a cache: the new rows only).
            memory: (B, S, D) the encoder's output; None with a ``cache``, which holds its
                keys and values (a memory given with a cache is refused: it would be ignored).
            mask: (B, T) bool, True = real target token; None = all real. With a cache, the
                new rows are all real (None).
            memory_mask: (B, S) bool, True = real source token; None = all real.
            cache: from :meth:`start_cache` or the previous call; then ``(y, cache)`` returns.
            backend: this call's attention backend; default the block's.

        Returns:
            y (B, T, D), zero at padded target positions; or ``(y, cache)`` when a cache is
            passed.
        """
        x, start, self_plan, cross_plan = prepare_call(
            self,
            x,
            memory,
            mask,
            memory_mask,
            cache,
            cache_type=LayerCache,
            heads=self.self_attn.n_heads,
            backend=self._backend if backend is None else backend,
        )
        y, new_cache = self.run(x, start, self_plan, cross_plan)
        if mask is not None:
            y = torch.where(mask[..., None], y, 0.0)
        return y if cache is None else (y, new_cache)

    def run(
        self, x: Tensor, cache: LayerCache, self_plan: LayerPlan, cross_plan: LayerPlan
    ) -> tuple[Tensor, LayerCache]:
        """One block as the plans say (trusted as they are); returns the rows and the cache
        with the new rows' keys and values appended."""
        past = (cache.keys, cache.values) if cache.length else None
        memory = (cache.memory_keys, cache.memory_values)
        if self_plan.fused_linear:
            # A fast route the plan chose (clearformer.fast) runs the whole block on this
            # block's own parameters: each residual add fused into a matrix product.
            x, (k, v) = self_plan.linear.impl.decoder_block(
                self, x, past, memory, self_plan, cross_plan
            )
            return x, LayerCache(k, v, cache.memory_keys, cache.memory_values)
        if self.norm == "pre":
            h = self.self_attn_norm(x)
            h, (k, v) = cached_self_attention(self.self_attn, h, self_plan, past)
            x = x + self.self_attn_dropout(h)
            h = memory_attention(self.cross_attn, self.cross_attn_norm(x), memory, cross_plan)
            x = x + self.cross_attn_dropout(h)
            x = x + self.mlp_dropout(self.mlp(self.mlp_norm(x)))
        else:
            h, (k, v) = cached_self_attention(self.self_attn, x, self_plan, past)
            x = self.self_attn_norm(x + self.self_attn_dropout(h))
            h = memory_attention(self.cross_attn, x, memory, cross_plan)
            x = self.cross_attn_norm(x + self.cross_attn_dropout(h))
            x = self.mlp_norm(x + self.mlp_dropout(self.mlp(x)))
        return x, LayerCache(k, v, cache.memory_keys, cache.memory_values)

    def _check_rows(self, t: Tensor, name: str, batch: int | None = None) -> None:
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        check_rows_dtype(t, name, self)
        if t.dim() != 3 or t.shape[-1] != self.d_model:
            raise ValueError(
                f"{name} must have shape (B, T, d_model={self.d_model}), got {tuple(t.shape)}"
            )
        if batch is not None and t.shape[0] != batch:
            raise ValueError(f"{name} must have batch size {batch} (x's), got {t.shape[0]}")

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, norm={self.norm!r}"


def memory_kv(attn: MultiHeadAttention, memory: Tensor) -> tuple[Tensor, Tensor]:
    """Keys and values of a memory (B, S, kv_dim) for cross-attention ``attn``, split into
    heads: (B, H, S, Dh) and (B, H, S, Dv). Computed once per source, then reused by every
    decoding step."""
    B, S, H = memory.shape[0], memory.shape[1], attn.n_heads
    if attn.kv_proj is not None:
        k, v = attn.kv_proj(memory).split([attn.qk_dim, attn.v_dim], dim=-1)
    else:
        _, (wk, bk), (wv, bv) = attn.projection_weights()
        k, v = F.linear(memory, wk, bk), F.linear(memory, wv, bv)
    # (B, S, H * Dh) -> (B, S, H, Dh) -> (B, H, S, Dh)
    k = k.view(B, S, H, attn.qk_dim // H).transpose(1, 2)
    v = v.view(B, S, H, attn.v_dim // H).transpose(1, 2)
    return k, v


def cached_self_attention(
    attn: MultiHeadAttention,
    x: Tensor,
    plan: LayerPlan,
    past: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """Self-attention of new rows ``x`` (B, t, in_dim) over the keys and values of earlier rows
    (``past``: (B, H, T_past, Dh) and (B, H, T_past, Dv)) and their own; ``plan`` is made for
    t queries and T_past + t keys. Returns out (B, t, out_dim) and the keys and values of all
    T_past + t rows (the cache to pass next time)."""
    q, k, v = (attn.split_heads(t, plan) for t in attn.project(x, x, x))  # (B, H, t, Dh)
    if past is not None:
        k = torch.cat([past[0], k], dim=2)  # (B, H, T_past + t, Dh)
        v = torch.cat([past[1], v], dim=2)
    out, _ = attn.context(q, k, v, plan)
    return attn.out_proj(out), (k, v)


def memory_attention(
    attn: MultiHeadAttention, x: Tensor, memory: tuple[Tensor, Tensor], plan: LayerPlan
) -> Tensor:
    """Cross-attention from ``x`` (B, t, in_dim) to a memory's keys and values from
    :func:`memory_kv`; ``plan`` is made for t queries and S keys. (B, t, out_dim)."""
    (wq, bq), _, _ = attn.projection_weights()
    q = attn.split_heads(F.linear(x, wq, bq), plan)  # (B, H, t, Dh)
    out, _ = attn.context(q, *memory, plan)
    return attn.out_proj(out)


def prepare_call(owner, x, memory, mask, memory_mask, cache, *, cache_type, heads, backend):
    """What a decoder call (one block or a stack) does before any layer runs: check the rows,
    the memory or the cache, plan self- and cross-attention once, zero padded target rows.

    ``owner`` is a :class:`DecoderBlock` or a stack (its ``start_cache`` projects the memory);
    ``cache_type`` is the cache it takes. Returns (x, the cache to start from, the two plans).
    """
    check_rows = (
        owner._check_rows if isinstance(owner, DecoderBlock) else owner.layers[0]._check_rows
    )
    check_rows(x, "x")
    if cache is None:
        if memory is None:
            raise ValueError("memory must be a (B, S, D) tensor unless a cache holds it")
        check_rows(memory, "memory", batch=x.shape[0])
        start = owner.start_cache(memory)
    else:
        if not isinstance(cache, cache_type):
            raise TypeError(f"cache must be a {cache_type.__name__}, got {type(cache).__name__}")
        if memory is not None:
            # The cache holds the memory's keys and values, projected when it was started: a
            # memory given here as well would be ignored, silently, even if it were another one.
            raise ValueError(
                "memory must be None with a cache (the cache holds the keys and values of the "
                "memory it was started on, start_cache(memory)), got a tensor of shape "
                f"{tuple(memory.shape)}"
            )
        if mask is not None:
            raise ValueError("mask must be None with a cache: decoded rows are all real tokens")
        if cache.batch != x.shape[0]:
            raise ValueError(f"cache holds {cache.batch} rows, got x of batch {x.shape[0]}")
        start = cache
    B, T, _ = x.shape
    # Planned once for every layer: the masks are validated here, before any work.
    self_plan, cross_plan = plan_decoder(
        owner,
        mask,
        memory_mask,
        batch=B,
        tq=T,
        past=start.length,
        memory_length=start.memory_length,
        heads=heads,
        device=x.device,
        backend=backend,
        dtype=x.dtype,
    )
    if mask is not None:
        x = torch.where(mask[..., None], x, 0.0)  # padded rows: zeros, whatever they held
    return x, start, self_plan, cross_plan
