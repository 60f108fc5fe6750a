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
    mlp: nn.Module,
    x: Tensor,
    residual: Tensor | None,
    norm: nn.Module | None = None,
    *,
    avx512: bool = False,
) -> Tensor:
    """``norm(residual + mlp(x))`` (no norm when None; no add when ``residual`` is None), the
    activation fused into the first product and the residual add (and norm) into the
    second; ``avx512``: the plan takes clearformer's AVX-512 linear kernel for the epilogues
    it serves."""
    if mlp.gated:
        gate, value = linear(x, mlp.fc_in, avx512=avx512).chunk(2, dim=-1)
        h = mlp.act(gate) * value  # (..., dim_mlp)
    else:
        h = linear(x, mlp.fc_in, avx512=avx512, activation=mlp.activation)
    return linear(h, mlp.fc_out, avx512=avx512, residual=residual, norm=norm)


def self_attention(
    attn: nn.Module,
    x: Tensor,
    plan: Any,
    residual: Tensor | None,
    norm: nn.Module | None = None,
    bias: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """``norm(residual + attn(x))``: the query, key and value product fused with its bias, the
    residual add (and norm) fused into the output product (no add when ``residual`` is None).
    The heads are split, and normed where the layer norms them, by the layer itself; ``bias``:
    the call's score bias, or None."""
    qkv = linear(x, attn.in_proj, avx512=plan.avx512_linear)  # (..., sum(attn.proj_sizes))
    q, k, v = attn.heads(*qkv.split(list(attn.proj_sizes), dim=-1), plan)
    out, weights = attn.context(q, k, v, plan, bias)
    out = linear(out, attn.out_proj, avx512=plan.avx512_linear, residual=residual, norm=norm)
    return out, weights


def encoder_block(
    block: nn.Module, x: Tensor, plan: Any, bias: Tensor | None = None
) -> tuple[Tensor, Tensor | None]:
    """One :class:`~clearformer.blocks.EncoderBlock` in inference (its dropouts are identities);
    returns the new rows and the attention weights (None). ``bias``: the call's score bias."""
    attn, mlp = block.attn, block.mlp
    if block.norm == "pre" and block.branch_norm:
        # Gemma3: each branch is normed before its add, so no add can go into a product.
        h, weights = self_attention(attn, block.attn_norm(x), plan, None, bias=bias)
        h = x + block.attn_out_norm(h)
        out = feed_forward(mlp, block.mlp_norm(h), None, avx512=plan.avx512_linear)
        return h + block.mlp_out_norm(out), weights
    if block.norm == "pre":
        h, weights = self_attention(attn, block.attn_norm(x), plan, residual=x, bias=bias)
        return feed_forward(mlp, block.mlp_norm(h), h, avx512=plan.avx512_linear), weights
    # Each norm goes into the product before it, which normalises its rows while they are in
    # cache where a kernel can (clearformer.fast.avx512_linear).
    h, weights = self_attention(attn, x, plan, residual=x, norm=block.attn_norm, bias=bias)
    out = feed_forward(mlp, h, h, block.mlp_norm, avx512=plan.avx512_linear)
    return out, weights


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
        return feed_forward(block.mlp, block.mlp_norm(x), x, avx512=self_plan.avx512_linear), kv
    h, kv = _cached_self_attention(block.self_attn, x, self_plan, past, residual=x)
    x = block.self_attn_norm(h)
    x = block.cross_attn_norm(_memory_attention(block.cross_attn, x, memory_kv, cross_plan, x))
    return block.mlp_norm(feed_forward(block.mlp, x, x, avx512=self_plan.avx512_linear)), kv


def _cached_self_attention(
    attn: nn.Module, x: Tensor, plan: Any, past: tuple[Tensor, Tensor] | None, residual: Tensor
) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    qkv = linear(x, attn.in_proj, avx512=plan.avx512_linear)
    q, k, v = qkv.split(list(attn.proj_sizes), dim=-1)
    q, k, v = (attn.split_heads(t, plan) for t in (q, k, v))  # (B, H, t, Dh)
    if past is not None:
        k = torch.cat([past[0], k], dim=2)  # (B, H, T_past + t, Dh)
        v = torch.cat([past[1], v], dim=2)
    out, _ = attn.context(q, k, v, plan)
    return linear(out, attn.out_proj, avx512=plan.avx512_linear, residual=residual), (k, v)


def _memory_attention(
    attn: nn.Module, x: Tensor, memory_kv: tuple[Tensor, Tensor], plan: Any, residual: Tensor
) -> Tensor:
    q = attn.split_heads(linear(x, attn.q_proj, avx512=plan.avx512_linear), plan)  # (B, H, t, Dh)
    out, _ = attn.context(q, *memory_kv, plan)
    return linear(out, attn.out_proj, avx512=plan.avx512_linear, residual=residual)
