"""Multi-head attention: project, split into heads, attend, merge, project back.

The interface follows seed 001: ``MultiHeadAttention(in_dim, qk_dim, v_dim, out_dim, n_heads,
attn_dropout)`` returning ``(out, attn_weights)``, with bool masks where True = takes part.

Dimensions: B batch, Tq queries, Tk keys, H heads, Hkv key/value heads, Dh = qk_dim / H,
Dv = v_dim / H, N real tokens of a packed batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..checks import (
    check_bool,
    check_choice,
    check_divisible,
    check_positive_float,
    check_positive_int,
    check_probability,
)
from ..dtypes import check_rows_dtype
from ..forward_plan import LayerPlan
from ..kernels import KERNELS
from ..options import BACKENDS
from ..padding import PackedLayout
from ..plan_lone import plan_layer
from ..positions import apply_rotary


class MultiHeadAttention(nn.Module):
    """Multi-head (self- or cross-) attention with interchangeable backends.

    Args:
        in_dim: width of the queries' input.
        qk_dim: total width of queries and keys over all heads (divisible by n_heads).
        v_dim: total width of values over all heads (divisible by n_heads).
        out_dim: width of the output.
        n_heads: number of heads H.
        attn_dropout: dropout on the attention probabilities (training only).
        kv_dim: width of the keys' and values' input; default ``in_dim``.
        bias: add biases to the projections.
        cross: cross-attention (keys and values from a memory): store the projections by role,
            ``q_proj`` and ``kv_proj``, even when ``kv_dim == in_dim``.
        backend: the backend of calls that name none: ``"auto"``, ``"math"``, ``"sdpa"`` or
            ``"varlen"`` (see :mod:`clearformer.plan`). A stack's plan overrides it.
        n_kv_heads: key/value heads Hkv (grouped-query attention: each serves H / Hkv query
            heads; 1: multi-query); default ``n_heads``.
        scale: the scores' scale; default Dh ** -0.5.
        q_norm, k_norm: modules applied to each head's queries and keys (..., Dh) after the
            head split, before rotary positions (Qwen3's and Gemma3's RMSNorm); default none.

    Parameters: for self-attention the query, key and value projections are stored as one
    ``in_proj`` (rows: queries, keys, values, as in ``torch.nn.MultiheadAttention``), so it costs
    one matrix product; for cross-attention (``cross=True`` or ``kv_dim != in_dim``) as
    ``q_proj`` and ``kv_proj``, so keys and values of one memory are one product too. Under
    grouped-query attention the key and value rows are fewer: ``in_proj.weight`` is
    ``(qk_dim + 2 * Hkv * Dh, in_dim)`` for Dh = Dv, a checkpoint's ``q_proj``, ``k_proj`` and
    ``v_proj`` weights concatenated in that order (``proj_sizes`` gives the three row counts).
    """

    def __init__(
        self,
        in_dim: int,
        qk_dim: int,
        v_dim: int,
        out_dim: int,
        n_heads: int,
        attn_dropout: float = 0.0,
        *,
        kv_dim: int | None = None,
        bias: bool = True,
        backend: str = "auto",
        cross: bool = False,
        n_kv_heads: int | None = None,
        scale: float | None = None,
        q_norm: nn.Module | None = None,
        k_norm: nn.Module | None = None,
    ) -> None:
        super().__init__()
        for value, name in ((n_heads, "n_heads"), (in_dim, "in_dim"), (out_dim, "out_dim")):
            check_positive_int(value, name)
        for value, name in ((qk_dim, "qk_dim"), (v_dim, "v_dim")):
            check_positive_int(value, name)
            check_divisible(value, n_heads, name, "n_heads")
        check_probability(attn_dropout, "attn_dropout")
        check_positive_int(kv_dim, "kv_dim", optional=True)
        check_positive_int(n_kv_heads, "n_kv_heads", optional=True)
        kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if n_heads % kv_heads:
            raise ValueError(
                f"n_kv_heads must divide n_heads, got n_kv_heads={kv_heads}, n_heads={n_heads}"
            )
        if scale is not None:
            check_positive_float(scale, "scale")
        if (q_norm is None) != (k_norm is None):
            raise ValueError("give both q_norm and k_norm, or neither")
        kv_dim = in_dim if kv_dim is None else kv_dim
        self.in_dim, self.qk_dim, self.v_dim, self.out_dim = in_dim, qk_dim, v_dim, out_dim
        self.kv_dim, self.n_heads, self.kv_heads = kv_dim, n_heads, kv_heads
        self.attn_dropout, self.scale = attn_dropout, scale
        self._backend = check_choice(backend, BACKENDS, "backend")
        # Rows of the query, key and value projections: H * Dh, Hkv * Dh, Hkv * Dv.
        k_width, v_width = qk_dim // n_heads * kv_heads, v_dim // n_heads * kv_heads
        self.proj_sizes = (qk_dim, k_width, v_width)

        # Parameters by role, fixed at construction: a call never concatenates weights.
        if kv_dim == in_dim and not cross:
            self.in_proj = nn.Linear(in_dim, sum(self.proj_sizes), bias=bias)
            self.q_proj = self.kv_proj = None
        else:
            self.in_proj = None
            self.q_proj = nn.Linear(in_dim, qk_dim, bias=bias)
            self.kv_proj = nn.Linear(kv_dim, k_width + v_width, bias=bias)
        self.q_norm, self.k_norm = q_norm, k_norm
        self.out_proj = nn.Linear(v_dim, out_dim, bias=bias)

    @property
    def backend(self) -> str:
        """The backend of a call that names none (read-only: a call chooses with ``backend=``)."""
        return self._backend

    def plan_for(
        self,
        query: Tensor,
        key: Tensor | None = None,
        mask: Tensor | None = None,
        *,
        is_causal: bool = False,
        need_weights: bool = False,
        backend: str | None = None,
        layout: PackedLayout | None = None,
    ) -> LayerPlan:
        """The plan of a lone call with these inputs: validated mask, kernel and why."""
        # Real bools: is_causal="no" would read as True and silently mask the future.
        check_bool(is_causal, "is_causal")
        check_bool(need_weights, "need_weights")
        key = query if key is None else key
        if layout is not None:
            self._check_packed_query(query, layout)
            B, Tq, Tk = layout.batch, layout.seqlen, layout.seqlen
        else:
            B, Tq, Tk = query.shape[0], query.shape[1], key.shape[1]
        return plan_layer(
            mask,
            batch=B,
            heads=self.n_heads,
            tq=Tq,
            tk=Tk,
            device=query.device,
            backend=self._backend if backend is None else backend,
            is_causal=is_causal,
            need_weights=need_weights,
            packing=layout,
            dtype=query.dtype,
            head_dim=self.qk_dim // self.n_heads,
            value_dim=self.v_dim // self.n_heads,
            grouped=self.kv_heads != self.n_heads,
            dropout=self.training and self.attn_dropout > 0.0,
            # Per-head norms make new queries and keys; a separate query projection (cross
            # attention) makes queries of another layout than the keys and values.
            rows_apart=self.q_norm is not None or self.in_proj is None,
        )

    # -- projections ---------------------------------------------------------------------------
    def projection_weights(self) -> tuple[tuple[Tensor, Tensor | None], ...]:
        """``((W_q, b_q), (W_k, b_k), (W_v, b_v))`` as views of the stored parameters."""
        sizes = list(self.proj_sizes)
        if self.in_proj is not None:
            w, b = self.in_proj.weight, self.in_proj.bias
            ws = w.split(sizes, dim=0)
            bs = b.split(sizes, dim=0) if b is not None else (None, None, None)
        else:
            wk, wv = self.kv_proj.weight.split(sizes[1:], dim=0)
            b = self.kv_proj.bias
            bk, bv = b.split(sizes[1:], dim=0) if b is not None else (None, None)
            ws = (self.q_proj.weight, wk, wv)
            bs = (self.q_proj.bias, bk, bv)
        return tuple(zip(ws, bs, strict=True))

    def project(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys and values, ``(..., H * Dh)``, ``(..., Hkv * Dh)``, ``(..., Hkv * Dv)``
        (``proj_sizes``)."""
        sizes = list(self.proj_sizes)
        if self.in_proj is not None:
            if key is query and value is query:
                # Self-attention: one matrix product for all three.
                return self.in_proj(query).split(sizes, dim=-1)  # (..., sum(proj_sizes))
            (wq, bq), (wk, bk), (wv, bv) = self.projection_weights()
            return F.linear(query, wq, bq), F.linear(key, wk, bk), F.linear(value, wv, bv)
        q = self.q_proj(query)
        if value is key:
            # Cross-attention over one memory: keys and values in one stored product.
            k, v = self.kv_proj(key).split(sizes[1:], dim=-1)
            return q, k, v
        (_, _), (wk, bk), (wv, bv) = self.projection_weights()
        return q, F.linear(key, wk, bk), F.linear(value, wv, bv)

    # -- forward -------------------------------------------------------------------------------
    def forward(
        self,
        query: Tensor,
        key: Tensor | None = None,
        value: Tensor | None = None,
        mask: Tensor | None = None,
        *,
        is_causal: bool = False,
        need_weights: bool = False,
        backend: str | None = None,
        layout: PackedLayout | None = None,
        plan: LayerPlan | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``query`` to ``key``/``value``.

        Args:
            query: (B, Tq, in_dim); or (N, in_dim) packed rows when ``layout`` is given.
            key: (B, Tk, kv_dim), default ``query`` (self-attention).
            value: (B, Tk, kv_dim), default ``key``.
            mask: bool, True = takes part; (B, Tk), (B, Tq, Tk) or (B, H, Tq, Tk).
            is_causal: query i sees keys j <= i + (Tk - Tq).
            need_weights: return the attention probabilities (``math`` backend only).
            backend: this call's backend; default the one given at construction.
            layout: the packed layout of ``query`` (self-attention on packed rows, no mask).
            plan: a plan made by a stack for this call: then no mask, flags or backend here;
                the plan is trusted as it is.

        Returns:
            out: (B, Tq, out_dim) (or (N, out_dim) packed); weights: (B, H, Tq, Tk) or None.
        """
        key = query if key is None else key
        value = key if value is None else value
        if plan is None:
            if layout is None:
                self._check_padded_inputs(query, key, value)
            elif key is not query or value is not query:
                raise ValueError("packed rows (layout given) support self-attention only")
            plan = self.plan_for(
                query,
                key,
                mask,
                is_causal=is_causal,
                need_weights=need_weights,
                backend=backend,
                layout=layout,
            )
        else:
            if (
                mask is not None
                or layout is not None
                or backend is not None
                or is_causal
                or need_weights
            ):
                raise ValueError(
                    "give either a plan or mask/layout/backend/is_causal/need_weights, not both: "
                    "the plan already holds them"
                )
            plan.check_rows(query, "query")
        return self.attend(query, key, value, plan)

    def attend(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        plan: LayerPlan,
        bias: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """The one attention path, whatever the layout: project, split heads, attend with the
        plan's kernel, merge heads, project out. ``bias``: the call's (H, L, L) score bias, or
        None."""
        q, k, v = self.heads(*self.project(query, key, value), plan)
        out, weights = self.context(q, k, v, plan, bias)
        return self.out_proj(out), weights  # (B, Tq, out_dim) or (N, out_dim)

    def heads(
        self, q: Tensor, k: Tensor, v: Tensor, plan: LayerPlan
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Projected rows -> heads: split (H query heads, Hkv key/value heads), then the
        per-head query and key norms where the layer has them. Every route (eager, fused)
        splits here, so the norms apply on all of them."""
        q = self.split_heads(q, plan)
        k, v = (self.split_heads(t, plan, self.kv_heads) for t in (k, v))
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)  # over each head's Dh features
        return q, k, v

    def context(
        self, q: Tensor, k: Tensor, v: Tensor, plan: LayerPlan, bias: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """Split heads in, merged context out (before ``out_proj``): (positions), the plan's
        kernel, merge heads. ``q``: (B, H, T, Dh) padded or (N, H, Dh) packed; ``k``/``v``
        the same with Hkv heads; the result (B, Tq, v_dim) or (N, v_dim), and the weights or
        None."""
        if plan.key_in_use is not None:
            # A key no query may see gets weight 0, but 0 * NaN is NaN: whatever a padded
            # position holds must not reach a real one, so its key and value become zeros.
            used = _per_kv_head(plan.key_in_use, k.shape[1])
            k = torch.where(used, k, 0.0)
            v = torch.where(used, v, 0.0)
        if plan.rotary is not None:
            # Positions enter here, once, for every layout: the plan's tables hold each row's
            # position within its own sequence (packed rows restart at 0 in every sequence).
            cos, sin = plan.rotary
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if q.dtype != v.dtype or k.dtype != v.dtype:
            # Under autocast the per-head norms and the rotary tables (float32) give float32
            # queries and keys beside values in the autocast dtype; attention takes one dtype,
            # the values' (as Hugging Face's norms return their input's dtype).
            q, k = q.to(v.dtype), k.to(v.dtype)
        dropout_p = self.attn_dropout if self.training else 0.0
        out, weights = KERNELS[plan.kernel.choice](q, k, v, plan, dropout_p, self.scale, bias)
        return self._merge_heads(out, plan), weights

    def split_heads(self, t: Tensor, plan: LayerPlan, heads: int | None = None) -> Tensor:
        """(B, T, H * Dh) -> (B, H, T, Dh) padded, (N, H * Dh) -> (N, H, Dh) packed, for
        ``heads`` heads (default H)."""
        H = self.n_heads if heads is None else heads
        if plan.packed:
            # (N, H*Dh) -> (N, H, Dh); explicit widths, so that a batch of no tokens (N = 0) works.
            return t.view(t.shape[0], H, t.shape[-1] // H)
        B, T, width = t.shape
        # (B, T, H*Dh) -> (B, T, H, Dh) -> (B, H, T, Dh): a view; the kernels read the strides.
        # Explicit widths, so that an empty batch (B = 0 or T = 0) works.
        return t.view(B, T, H, width // H).transpose(1, 2)

    def _merge_heads(self, out: Tensor, plan: LayerPlan) -> Tensor:
        if plan.packed:
            return out.reshape(out.shape[0], self.v_dim)  # (N, H, Dv) -> (N, H*Dv)
        B, _, Tq, _ = out.shape
        return out.transpose(1, 2).reshape(B, Tq, self.v_dim)  # (B, H, Tq, Dv) -> (B, Tq, H*Dv)

    def _check_packed_query(self, query: Tensor, layout: PackedLayout) -> None:
        if not isinstance(query, Tensor) or query.dim() != 2 or query.shape[-1] != self.in_dim:
            shape = tuple(query.shape) if isinstance(query, Tensor) else type(query).__name__
            raise ValueError(
                f"packed query must have shape (N, in_dim) = (N, {self.in_dim}), got {shape}"
            )
        check_rows_dtype(query, "query", self)
        if query.shape[0] != layout.num_tokens:
            raise ValueError(
                f"packed query has {query.shape[0]} rows but the layout holds "
                f"{layout.num_tokens} tokens"
            )

    def _check_padded_inputs(self, query: Tensor, key: Tensor, value: Tensor) -> None:
        for t, name, width, width_name in (
            (query, "query", self.in_dim, "in_dim"),
            (key, "key", self.kv_dim, "kv_dim"),
            (value, "value", self.kv_dim, "kv_dim"),
        ):
            if not isinstance(t, Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            check_rows_dtype(t, name, self)
            if t.dim() != 3:
                raise ValueError(
                    f"{name} must be 3-D (B, T, {width_name}={width}), got shape {tuple(t.shape)}"
                )
            if t.shape[-1] != width:
                raise ValueError(
                    f"{name} last dim must be {width_name}={width}, got {t.shape[-1]} "
                    f"(shape {tuple(t.shape)})"
                )
            if t.device != query.device:
                raise ValueError(
                    f"{name} must be on the query's device {query.device}, got {t.device}"
                )
        if key.shape[0] != query.shape[0] or value.shape[0] != query.shape[0]:
            raise ValueError(
                f"query, key and value must share the batch size, got {query.shape[0]}, "
                f"{key.shape[0]}, {value.shape[0]}"
            )
        if key.shape[1] != value.shape[1]:
            raise ValueError(
                f"key and value must have the same length Tk, got {key.shape[1]} and "
                f"{value.shape[1]}"
            )

    def extra_repr(self) -> str:
        grouped = f", n_kv_heads={self.kv_heads}" if self.kv_heads != self.n_heads else ""
        scale = f", scale={self.scale}" if self.scale is not None else ""
        return (
            f"in_dim={self.in_dim}, qk_dim={self.qk_dim}, v_dim={self.v_dim}, "
            f"out_dim={self.out_dim}, n_heads={self.n_heads}{grouped}, "
            f"attn_dropout={self.attn_dropout}{scale}, backend={self._backend!r}"
        )


def _per_kv_head(used: Tensor, kv_heads: int) -> Tensor:
    """(B, H|1, Tk, 1) "some query uses this key" -> per key/value head (B, Hkv|1, Tk, 1): a
    grouped key is in use when any query head of its group uses it."""
    heads = used.shape[1]
    if heads == 1 or heads == kv_heads:
        return used
    B, _, Tk, _ = used.shape
    # (B, H, Tk, 1) -> (B, Hkv, H / Hkv, Tk, 1) -> any over each group's query heads.
    return used.view(B, kv_heads, heads // kv_heads, Tk, 1).any(dim=2)
