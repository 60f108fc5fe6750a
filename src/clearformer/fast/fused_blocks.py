"""Whole blocks with fused linear layers: the route a plan names for CPU inference in float32.

The eager block computes ``x + out_proj(attention)`` and then, post-norm, ``LayerNorm`` of it,
as three passes over the rows. Here each residual add (and a post-norm block's LayerNorm, where
a kernel takes it) happens inside the matrix product that produces the branch
(:func:`clearformer.fast.fused_linear.linear`), and the feed-forward's activation inside its
first product. The functions read the block's own parameters and give the eager block's values
up to float rounding; attention itself runs the plan's kernel through
:meth:`MultiHeadAttention.context`, as the eager block does.

A plan names this module in ``ForwardPlan.linear`` (``Decision("fused", ..., impl=...)``); the
blocks call it without importing it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from .fused_linear import linear

__all__ = ["decoder_block", "encoder_block", "feed_forward"]


def feed_forward(
    mlp: nn.Module, x: Tensor, residual: Tensor | None, norm: nn.Module | None = None
) -> Tensor:
    """``norm(residual + mlp(x))`` (no norm when None; no add when ``residual`` is None), the
    activation fused into the first product and the residual add (and norm) into the
    second."""
    if mlp.gated:
        gate, value = linear(x, mlp.fc_in, fused=True).chunk(2, dim=-1)
        h = mlp.act(gate) * value  # (..., dim_mlp)
    else:
        h = linear(x, mlp.fc_in, fused=True, activation=mlp.activation)
    return linear(h, mlp.fc_out, fused=True, residual=residual, norm=norm)


def self_attention(
    attn: nn.Module, x: Tensor, plan: Any, residual: Tensor | None, norm: nn.Module | None = None
) -> tuple[Tensor, Tensor | None]:
    """``norm(residual + attn(x))``: the query, key and value product fused with its bias, the
    residual add (and norm) fused into the output product (no add when ``residual`` is None).
    The heads are split, and normed where the layer norms them, by the layer itself."""
    qkv = linear(x, attn.in_proj, fused=True)  # (..., sum(attn.proj_sizes))
    q, k, v = attn.heads(*qkv.split(list(attn.proj_sizes), dim=-1), plan)
    out, weights = attn.context(q, k, v, plan)
    return linear(out, attn.out_proj, fused=True, residual=residual, norm=norm), weights


def encoder_block(block: nn.Module, x: Tensor, plan: Any) -> tuple[Tensor, Tensor | None]:
    """One :class:`~clearformer.blocks.EncoderBlock` in inference (its dropouts are identities);
    returns the new rows and the attention weights (None)."""
    if block.norm == "pre" and block.branch_norm:
        # Gemma3: each branch is normed before its add, so no add can go into a product.
        h, weights = self_attention(block.attn, block.attn_norm(x), plan, residual=None)
        h = x + block.attn_out_norm(h)
        out = feed_forward(block.mlp, block.mlp_norm(h), residual=None)
        return h + block.mlp_out_norm(out), weights
    if block.norm == "pre":
        h, weights = self_attention(block.attn, block.attn_norm(x), plan, residual=x)
        return feed_forward(block.mlp, block.mlp_norm(h), residual=h), weights
    # Each norm goes into the product before it, which normalises its rows while they are in
    # cache where a kernel can (clearformer.fast.avx512_linear).
    h, weights = self_attention(block.attn, x, plan, residual=x, norm=block.attn_norm)
    return feed_forward(block.mlp, h, residual=h, norm=block.mlp_norm), weights


def decoder_block(
    block: nn.Module,
    x: Tensor,
    past: tuple[Tensor, Tensor] | None,
    memory_kv: tuple[Tensor, Tensor],
    self_plan: Any,
    cross_plan: Any,
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """One :class:`~clearformer.decoder_block.DecoderBlock` call in inference (dropouts are
    identities): causal self-attention of the new rows ``x`` (B, t, D) over the ``past`` keys
    and values and their own, cross-attention to the memory's keys and values, the feed-forward
    network. Returns the new rows and the self-attention keys and values of all rows."""
    if block.norm == "pre":
        x, kv = _cached_self_attention(block.self_attn, block.self_attn_norm(x), self_plan, past, x)
        x = _memory_attention(block.cross_attn, block.cross_attn_norm(x), memory_kv, cross_plan, x)
        return feed_forward(block.mlp, block.mlp_norm(x), residual=x), kv
    h, kv = _cached_self_attention(block.self_attn, x, self_plan, past, residual=x)
    x = block.self_attn_norm(h)
    x = block.cross_attn_norm(_memory_attention(block.cross_attn, x, memory_kv, cross_plan, x))
    return block.mlp_norm(feed_forward(block.mlp, x, residual=x)), kv


def _cached_self_attention(
    attn: nn.Module, x: Tensor, plan: Any, past: tuple[Tensor, Tensor] | None, residual: Tensor
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    q, k, v = linear(x, attn.in_proj, fused=True).split(list(attn.proj_sizes), dim=-1)
    q, k, v = (attn.split_heads(t, plan) for t in (q, k, v))  # (B, H, t, Dh)
    if past is not None:
        k = torch.cat([past[0], k], dim=2)  # (B, H, T_past + t, Dh)
        v = torch.cat([past[1], v], dim=2)
    out, _ = attn.context(q, k, v, plan)
    return linear(out, attn.out_proj, fused=True, residual=residual), (k, v)


def _memory_attention(
    attn: nn.Module, x: Tensor, memory_kv: tuple[Tensor, Tensor], plan: Any, residual: Tensor
) -> Tensor:
    q = attn.split_heads(linear(x, attn.q_proj, fused=True), plan)  # (B, H, t, Dh)
    out, _ = attn.context(q, *memory_kv, plan)
    return linear(out, attn.out_proj, fused=True, residual=residual)
