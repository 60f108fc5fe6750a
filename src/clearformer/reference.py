"""The reference encoder: the whole math of a Transformer encoder, in one file.

Read this file first. It is the specification every fast path is tested against, and the
path ``clearformer explain`` records (every ``record(...)`` call of the encoder lives here).

It runs on a production model's own modules and parameters (``Encoder``, ``EncoderBlock``,
``MultiHeadAttention``, ``FeedForward``), never on copies, on the padded layout only:

    x (B, T, D), mask (B, T) bool, True = real token
      -> N x block:  pre-norm   x = x + Attn(Norm1(x));  x = x + FFN(Norm2(x))
                     (branch norms, Gemma3: x = x + NormA(Attn(Norm1(x))), the same for FFN)
                     post-norm  x = Norm1(x + Attn(x));  x = Norm2(x + FFN(x))
      -> final norm (pre-norm stacks) -> (B, T, D), zero at padded positions

Attention is written as its four steps: scores -> mask -> softmax -> weighted sum. Rotary
positions, local (sliding-window) layers, a causal mask, a relative position bias, grouped
keys and values, and per-head query/key norms are plain tensor operations on the way; so is
RMSNorm. Packed rows, fused matrix products and kernels live elsewhere (:mod:`clearformer.plan`
chooses them, :mod:`clearformer.fast` holds them); each gives these values up to float rounding.
Written for reading, not speed: where a kernel can avoid a copy (the repeated keys and values
of grouped-query attention) or a (T, T) mask, this file still makes it, so that every step is
a tensor one can print.

Dimensions: B batch, T positions, D model width, H heads, Hkv key/value heads, Dh head width,
Tq / Tk queries / keys.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .tracing import record

__all__ = [
    "attention",
    "decoder_block",
    "encoder",
    "encoder_block",
    "feed_forward",
    "rms_norm",
    "scaled_dot_product",
]


# -- attention --------------------------------------------------------------------------------
def scaled_dot_product(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    *,
    bias: Tensor | None = None,
    dropout_p: float = 0.0,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    """softmax(q k^T / sqrt(Dh) + bias, masked) v.

    Args:
        q: (B, H, Tq, Dh) queries. k: (B, Hkv, Tk, Dh) keys. v: (B, Hkv, Tk, Dv) values; H a
            multiple of Hkv (grouped-query attention: query head h reads key/value head
            h // (H / Hkv), as Hugging Face's ``repeat_kv`` and SDPA's ``enable_gqa`` do).
        mask: bool, broadcastable to (B, H, Tq, Tk), True = the query may attend the key.
        bias: float, broadcastable to (B, H, Tq, Tk), added to the scores; or None.
        dropout_p: dropout on the probabilities (0 in eval).
        scale: the scores' scale; None: Dh ** -0.5.

    Returns:
        out (B, H, Tq, Dv) and the probabilities (B, H, Tq, Tk). A query with no key to attend
        gets probabilities 0 and output 0.
    """
    if k.shape[-3] != q.shape[-3]:
        # Grouped keys and values, repeated here to one per query head: (B, Hkv, Tk, Dh) ->
        # (B, H, Tk, Dh). The fast kernels read each group's keys in place instead.
        groups = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(groups, dim=-3), v.repeat_interleave(groups, dim=-3)
    # Dividing by sqrt(Dh) keeps the scores' variance near 1 whatever the head width: the dot
    # product of two random Dh-vectors has variance Dh, and a softmax of large scores saturates.
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    # Scale q before the product: in float16 the unscaled dot products can overflow.
    scores = torch.matmul(q * scale, k.transpose(-2, -1))  # (B, H, Tq, Tk)
    record("attn.scores", scores)
    if bias is not None:  # a relative position bias: what the scores add by distance alone
        scores = scores + bias.to(scores.dtype)
        record("attn.biased_scores", scores)
    if mask is not None:
        # The most negative finite value, not -inf: a row with every key masked stays finite
        # (uniform) through the softmax and is zeroed just below, so neither the output nor
        # the gradient can become NaN. finfo(dtype).min is safe in every dtype.
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        record("attn.masked_scores", scores, mask=mask)
    # Softmax in float32 at least: half-precision exponentials lose the small weights.
    weights = F.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32))
    weights = weights.to(q.dtype)
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)  # masked keys get exactly 0
    record("attn.weights", weights)
    probs = F.dropout(weights, p=dropout_p) if dropout_p > 0.0 else weights
    out = torch.matmul(probs, v)  # (B, H, Tq, Dv)
    record("attn.context", out)
    return out, weights


def rotate(x: Tensor, positions: Tensor, theta: float) -> Tensor:
    """Rotary positions (Su et al., 2021) on queries or keys ``x`` (B, H, T, Dh).

    Feature pairs (i, i + Dh/2) turn by the angle ``position * theta ** (-2i / Dh)``, so the
    dot product of a rotated query and key depends only on how far apart they are. The angles
    are computed in float32: at positions in the thousands, half precision loses them.
    """
    Dh = x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, Dh, 2, device=x.device).float() / Dh)  # (Dh/2,)
    angles = positions.float()[..., None] * inv_freq  # (B, T, Dh/2)
    angles = torch.cat([angles, angles], dim=-1)[:, None]  # (B, 1, T, Dh): both halves alike
    wide = x.float()
    first, second = wide.chunk(2, dim=-1)
    rotated_half = torch.cat([-second, first], dim=-1)  # (x1, x2) -> (-x2, x1)
    return (wide * angles.cos() + rotated_half * angles.sin()).to(x.dtype)


def rms_norm(norm: nn.Module, x: Tensor) -> Tensor:  # norm: an RMSNorm
    """RMSNorm over the last dimension: ``x / sqrt(mean(x²) + eps)`` scaled, no centring.

    Computed in float32 at least (a mean of squares in half precision overflows and rounds).
    The two scalings are the checkpoints' own, rounding included: ``weight`` times the normed
    rows cast back to x's dtype (Qwen3, Llama), or ``1 + weight`` applied in float32 before the
    cast (Gemma, whose weights are stored as offsets from 1).
    """
    wide = x.to(torch.promote_types(x.dtype, torch.float32))
    normed = wide * torch.rsqrt(wide.pow(2).mean(dim=-1, keepdim=True) + norm.eps)
    if norm.unit_offset:
        return (normed * (1.0 + norm.weight.to(wide.dtype))).to(x.dtype)
    return norm.weight * normed.to(x.dtype)


def attention(
    attn: nn.Module,  # a MultiHeadAttention
    x: Tensor,
    mask: Tensor | None,
    *,
    memory: Tensor | None = None,
    positions: Tensor | None = None,
    rope_theta: float | None = None,
    bias: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Multi-head attention from ``x`` (B, Tq, D) to itself, or to ``memory`` (B, Tk, D)
    (cross-attention), with ``attn``'s parameters.

    Args:
        mask: bool, broadcastable to (B, H, Tq, Tk): which key each query may attend; None: all.
        positions: (B, T) each token's position in its sequence (for rotary positions).
        rope_theta: the rotary base; None = no rotary positions.
        bias: (H, Tq, Tk) added to every score; None = no bias.

    Returns:
        out (B, Tq, D) and the attention probabilities (B, H, Tq, Tk).
    """
    B, T, _ = x.shape
    if memory is None:
        # One product: in_proj's rows are W_q (H * Dh), W_k and W_v (Hkv * Dh each; see mha.py).
        q, k, v = attn.in_proj(x).split(attn.proj_sizes, dim=-1)
    else:
        # Cross-attention: queries from x, keys and values from the memory (one product).
        q = attn.q_proj(x)
        k, v = attn.kv_proj(memory).split(attn.proj_sizes[1:], dim=-1)
    record("attn.q_proj", q)
    record("attn.k_proj", k)
    record("attn.v_proj", v)
    # (B, T, heads * Dh) -> (B, T, heads, Dh) -> (B, heads, T, Dh): each head attends on its
    # own slice; queries have H heads, keys and values Hkv.
    # (Head widths from the projections' own sizes: -1 cannot be inferred for an empty batch.)
    q = q.view(B, T, attn.n_heads, q.shape[-1] // attn.n_heads).transpose(1, 2)
    k, v = (
        t.view(B, t.shape[1], attn.kv_heads, t.shape[-1] // attn.kv_heads).transpose(1, 2)
        for t in (k, v)
    )
    record("attn.split_heads", q)
    if attn.q_norm is not None:
        # Each head's queries and keys normed over their Dh features (Qwen3, Gemma3).
        q, k = attn.q_norm(q), attn.k_norm(k)
        record("attn.qk_norm", q)
    if rope_theta is not None:
        q, k = rotate(q, positions, rope_theta), rotate(k, positions, rope_theta)
        record("attn.rotary", q)
    dropout_p = attn.attn_dropout if attn.training else 0.0
    bias = None if bias is None else bias[None]  # (1, H, T, T)
    out, weights = scaled_dot_product(
        q, k, v, mask, bias=bias, dropout_p=dropout_p, scale=attn.scale
    )
    out = out.transpose(1, 2).reshape(B, T, attn.v_dim)  # (B, H, T, Dv) -> (B, T, H * Dv)
    record("attn.merge_heads", out)
    out = attn.out_proj(out)  # (B, T, D)
    record("attn.out_proj", out)
    return out, weights


# -- feed-forward -----------------------------------------------------------------------------
def feed_forward(mlp: nn.Module, x: Tensor) -> Tensor:  # mlp: a FeedForward
    """Position-wise: ``fc_out(act(fc_in(x)))``; gated (SwiGLU, GeGLU): ``fc_in`` gives a gate
    and a value, ``fc_out(act(gate) * value)``. (..., D) -> (..., D)."""
    h = mlp.fc_in(x)  # (..., dim_mlp), or (..., 2 * dim_mlp) when gated
    record("ffn.hidden", h)
    if mlp.gated:
        # The first half is the gate (a checkpoint's gate_proj), the second the value (up_proj).
        gate, value = h.chunk(2, dim=-1)  # two (..., dim_mlp) halves
        h = mlp.act(gate) * value
    else:
        h = mlp.act(h)
    record("ffn.activation", h)
    out = mlp.fc_out(h)  # (..., D)
    record("ffn.output", out)
    return out


# -- the block --------------------------------------------------------------------------------
def encoder_block(
    block: nn.Module,  # an EncoderBlock
    x: Tensor,
    mask: Tensor | None,
    *,
    positions: Tensor | None = None,
    rope_theta: float | None = None,
    bias: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """One block on ``x`` (B, T, D); ``mask`` as in :func:`attention`. Returns the new rows and
    the attention probabilities."""
    record("block.input", x)
    where = dict(positions=positions, rope_theta=rope_theta, bias=bias)
    if block.norm == "pre":
        # Pre-norm: the residual stream carries the raw input; each branch reads it normed.
        # With branch norms (Gemma3) each branch's output is normed too before it is added;
        # without, attn_out_norm and mlp_out_norm are identities.
        h = block.attn_norm(x)
        record("block.attn_input", h)
        h, weights = attention(block.attn, h, mask, **where)
        x = x + block.attn_residual_dropout(block.attn_out_norm(h))
        record("block.attn_residual", x)
        h = block.mlp_norm(x)
        record("block.mlp_input", h)
        # Calling the module runs feed_forward() above (and any hook a user put on it).
        x = x + block.mlp_residual_dropout(block.mlp_out_norm(block.mlp(h)))
        record("block.mlp_residual", x)
    else:
        # Post-norm (BERT): each branch reads the raw rows; the sum is normed.
        record("block.attn_input", x)
        h, weights = attention(block.attn, x, mask, **where)
        x = block.attn_norm(x + block.attn_residual_dropout(h))
        record("block.attn_residual", x)
        record("block.mlp_input", x)
        x = block.mlp_norm(x + block.mlp_residual_dropout(block.mlp(x)))
        record("block.mlp_residual", x)
    return x, weights


# -- the stack --------------------------------------------------------------------------------
def encoder(
    stack: nn.Module,
    x: Tensor,
    mask: Tensor | None = None,  # stack: an Encoder
    *,
    keys: Tensor | None = None,
) -> tuple[Tensor, tuple[Tensor, ...], tuple[Tensor, ...]]:
    """The stack on ``x`` (B, T, D) with the (B, T) ``mask`` (True = real token; None: all real).

    ``keys`` (B, T) bool, when given, narrows the tokens a query may attend to those it marks
    (and ``mask``'s): tokens outside it are computed as queries but never seen as keys. ColBERT's
    query expansion runs so: its [MASK] tokens read the query without changing it.

    Returns:
        the last hidden state (B, T, D), every hidden state (the input and each block's output,
        ``n_layers + 1`` tensors, before the final norm) and every block's attention
        probabilities (B, H, T, T); hidden states are zero at padded positions.
    """
    config = stack.config
    B, T, _ = x.shape
    keep = torch.ones(B, T, dtype=torch.bool, device=x.device) if mask is None else mask
    # A padded position may hold anything (NaN included): it becomes zero once, here, and no
    # query ever attends to it, so it can never reach a real token.
    x = torch.where(keep[..., None], x, 0.0)
    # Each token's position among its sequence's real tokens (left padding counts from 0 too).
    positions = (keep.cumsum(dim=1) - 1).clamp(min=0)  # (B, T)
    bias = None if stack.relative_bias is None else stack.relative_bias(T)  # (H, T, T)
    # (B, 1, 1, T): every query may see the real keys (None: every key is real).
    attend = keep if keys is None else keep & keys
    keys = None if mask is None and keys is None else attend[:, None, None, :]
    rows = torch.arange(T, device=x.device)
    if config.causal:
        # Query i sees keys j <= i only: row order is token order within each sequence (with
        # holes in the mask too), so this is "earlier tokens of its own sequence".
        before = rows[None, :] <= rows[:, None]  # (T, T)
        keys = before if keys is None else keys & before  # (B, 1, T, T)
    hidden, attentions = [x], []
    for index, (block, layer_type) in enumerate(zip(stack.layers, config.layer_types, strict=True)):
        record("encoder.layer", x, layer=index)
        allowed, window = keys, config.window_of(layer_type)
        if window is not None:
            # A local layer: query i sees only keys j with |i - j| <= window (and j <= i when
            # causal). Each sequence's real tokens are one run: row distance is token distance.
            band = (rows[:, None] - rows[None, :]).abs() <= window  # (T, T)
            allowed = band if allowed is None else allowed & band  # (B, 1, T, T)
        x, weights = encoder_block(
            block,
            x,
            allowed,
            positions=positions,
            rope_theta=config.rope_theta_of(layer_type),
            bias=bias,
        )
        hidden.append(torch.where(keep[..., None], x, 0.0))
        attentions.append(weights)
    x = stack.final_norm(x)
    record("encoder.output", x)
    # Padded positions were computed like any query; the result holds zeros there.
    return torch.where(keep[..., None], x, 0.0), tuple(hidden), tuple(attentions)


# -- the decoder block ------------------------------------------------------------------------
def decoder_block(
    block: nn.Module,  # a DecoderBlock
    x: Tensor,
    memory: Tensor,
    mask: Tensor | None = None,
    memory_mask: Tensor | None = None,
) -> Tensor:
    """One decoder block: causal self-attention over ``x`` (B, T, D), cross-attention to
    ``memory`` (B, S, D), a feed-forward network. ``mask`` (B, T) / ``memory_mask`` (B, S):
    True = real token (None: all real). Returns (B, T, D), zero at padded target positions."""
    B, T, _ = x.shape
    keep = torch.ones(B, T, dtype=torch.bool, device=x.device) if mask is None else mask
    x = torch.where(keep[..., None], x, 0.0)
    # Token i sees tokens j <= i, and only real ones: (B, 1, T, T).
    causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
    self_mask = causal[None, None] & keep[:, None, None, :]
    cross_mask = None if memory_mask is None else memory_mask[:, None, None, :]  # (B, 1, 1, S)
    if block.norm == "pre":
        h, _ = attention(block.self_attn, block.self_attn_norm(x), self_mask)
        x = x + block.self_attn_dropout(h)
        h, _ = attention(block.cross_attn, block.cross_attn_norm(x), cross_mask, memory=memory)
        x = x + block.cross_attn_dropout(h)
        x = x + block.mlp_dropout(block.mlp(block.mlp_norm(x)))
    else:
        h, _ = attention(block.self_attn, x, self_mask)
        x = block.self_attn_norm(x + block.self_attn_dropout(h))
        h, _ = attention(block.cross_attn, x, cross_mask, memory=memory)
        x = block.cross_attn_norm(x + block.cross_attn_dropout(h))
        x = block.mlp_norm(x + block.mlp_dropout(block.mlp(x)))
    return torch.where(keep[..., None], x, 0.0)
