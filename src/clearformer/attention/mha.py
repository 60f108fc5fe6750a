"""Multi-head attention: project, split into heads, attend, merge, project back.

The interface follows seed 001: ``MultiHeadAttention(in_dim, qk_dim, v_dim, out_dim, n_heads,
attn_dropout)`` returning ``(out, attn_weights)``, with bool masks where True = takes part.

Dimensions: B batch, Tq queries, Tk keys, H heads, Dh = qk_dim / H, Dv = v_dim / H,
N real tokens of a packed batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..masks import prepare_attention_mask
from ..padding import PackedLayout
from ..tracing import record
from .dispatch import BackendChoice, check_backend_name, select_backend
from .math import math_attention
from .sdpa import sdpa_attention
from .varlen import varlen_attention

_PADDED_BACKENDS = {"math": math_attention, "sdpa": sdpa_attention}


def _check_divisible(value: int, n_heads: int, name: str) -> None:
    if not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    if value % n_heads != 0:
        raise ValueError(
            f"{name} must be divisible by n_heads: {name}={value}, n_heads={n_heads} "
            f"leaves a remainder of {value % n_heads}"
        )


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
        backend: ``"auto"``, ``"math"``, ``"sdpa"`` or ``"varlen"``
            (see :mod:`clearformer.attention.dispatch`).

    Parameters: when ``kv_dim == in_dim`` the query, key and value projections are stored as one
    ``in_proj`` (rows: queries, keys, values, as in ``torch.nn.MultiheadAttention``), so
    self-attention costs one matrix product; otherwise ``q_proj`` and ``kv_proj``.
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
    ) -> None:
        super().__init__()
        if not isinstance(n_heads, int) or n_heads <= 0:
            raise ValueError(f"n_heads must be a positive int, got {n_heads!r}")
        for value, name in ((in_dim, "in_dim"), (out_dim, "out_dim")):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        _check_divisible(qk_dim, n_heads, "qk_dim")
        _check_divisible(v_dim, n_heads, "v_dim")
        if not isinstance(attn_dropout, (int, float)) or not 0.0 <= attn_dropout < 1.0:
            raise ValueError(f"attn_dropout must be in [0, 1), got {attn_dropout}")
        kv_dim = in_dim if kv_dim is None else kv_dim
        if not isinstance(kv_dim, int) or kv_dim <= 0:
            raise ValueError(f"kv_dim must be a positive int or None, got {kv_dim!r}")
        self.in_dim, self.qk_dim, self.v_dim, self.out_dim = in_dim, qk_dim, v_dim, out_dim
        self.kv_dim, self.n_heads = kv_dim, n_heads
        self.attn_dropout = attn_dropout
        self.backend = check_backend_name(backend)

        if kv_dim == in_dim:
            self.in_proj = nn.Linear(in_dim, 2 * qk_dim + v_dim, bias=bias)
            self.q_proj = self.kv_proj = None
        else:
            self.in_proj = None
            self.q_proj = nn.Linear(in_dim, qk_dim, bias=bias)
            self.kv_proj = nn.Linear(kv_dim, qk_dim + v_dim, bias=bias)
        self.out_proj = nn.Linear(v_dim, out_dim, bias=bias)

    # -- the backend ---------------------------------------------------------------------------
    def backend_for(self, *, need_weights: bool = False, packed: bool = False) -> BackendChoice:
        """Which backend a call with these options runs on, and why."""
        return select_backend(self.backend, need_weights=need_weights, packed=packed)

    @property
    def backend_choice(self) -> BackendChoice:
        """The backend a plain padded call (no weights) runs on, and why."""
        return self.backend_for()

    # -- projections ---------------------------------------------------------------------------
    def projection_weights(self) -> tuple[tuple[Tensor, Tensor | None], ...]:
        """``((W_q, b_q), (W_k, b_k), (W_v, b_v))`` as views of the stored parameters."""
        qk, v = self.qk_dim, self.v_dim
        if self.in_proj is not None:
            w, b = self.in_proj.weight, self.in_proj.bias
            ws = w.split([qk, qk, v], dim=0)
            bs = b.split([qk, qk, v], dim=0) if b is not None else (None, None, None)
        else:
            wk, wv = self.kv_proj.weight.split([qk, v], dim=0)
            b = self.kv_proj.bias
            bk, bv = b.split([qk, v], dim=0) if b is not None else (None, None)
            ws = (self.q_proj.weight, wk, wv)
            bs = (self.q_proj.bias, bk, bv)
        return tuple(zip(ws, bs, strict=True))

    def project(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys and values, ``(..., qk_dim)``, ``(..., qk_dim)``, ``(..., v_dim)``."""
        if self.in_proj is not None and key is query and value is query:
            # Self-attention: one fused matrix product for all three.
            qkv = self.in_proj(query)  # (..., 2 * qk_dim + v_dim)
            return qkv.split([self.qk_dim, self.qk_dim, self.v_dim], dim=-1)
        (wq, bq), (wk, bk), (wv, bv) = self.projection_weights()
        q = F.linear(query, wq, bq)
        if value is key:
            # Cross-attention over one memory: keys and values in one product.
            bkv = None if bk is None else torch.cat([bk, bv])
            k, v = F.linear(key, torch.cat([wk, wv]), bkv).split([self.qk_dim, self.v_dim], -1)
        else:
            k, v = F.linear(key, wk, bk), F.linear(value, wv, bv)
        return q, k, v

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
        layout: PackedLayout | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``query`` to ``key``/``value``.

        Args:
            query: (B, Tq, in_dim); or (N, in_dim) packed rows when ``layout`` is given.
            key: (B, Tk, kv_dim), default ``query`` (self-attention).
            value: (B, Tk, kv_dim), default ``key``.
            mask: bool, True = takes part; (B, Tk), (B, Tq, Tk) or (B, H, Tq, Tk).
            is_causal: query i sees keys j <= i + (Tk - Tq).
            need_weights: return the attention probabilities (``math`` backend only).
            layout: the packed layout of ``query`` (self-attention on packed rows, no mask).

        Returns:
            out: (B, Tq, out_dim) (or (N, out_dim) packed); weights: (B, H, Tq, Tk) or None.
        """
        key = query if key is None else key
        value = key if value is None else value
        if layout is not None:
            return self._forward_packed(query, key, value, mask, layout, is_causal, need_weights)

        self._check_padded_inputs(query, key, value)
        B, Tq, _ = query.shape
        Tk = key.shape[1]
        H = self.n_heads
        mask = prepare_attention_mask(
            mask, batch=B, heads=H, tq=Tq, tk=Tk, device=query.device, name="mask"
        )
        choice = self.backend_for(need_weights=need_weights)
        if choice.name == "varlen":
            raise ValueError(
                "backend='varlen' runs on packed rows: pass (N, in_dim) rows with a layout from "
                "clearformer.padding.unpad, or use Encoder, which packs at the stack's edge; "
                "for a padded (B, T, D) batch use backend='sdpa' or 'auto'"
            )

        q, k, v = self.project(query, key, value)
        record("attn.q_proj", q)
        record("attn.k_proj", k)
        record("attn.v_proj", v)
        # (B, T, H*Dh) -> (B, T, H, Dh) -> (B, H, T, Dh): a view; the kernels read the strides.
        q = q.view(B, Tq, H, -1).transpose(1, 2)
        record("attn.split_heads", q)
        k = k.view(B, Tk, H, -1).transpose(1, 2)
        v = v.view(B, Tk, H, -1).transpose(1, 2)
        attend = _PADDED_BACKENDS[choice.name]
        out, weights = attend(
            q,
            k,
            v,
            mask,
            is_causal=is_causal,
            dropout_p=self.attn_dropout if self.training else 0.0,
            need_weights=need_weights,
        )  # (B, H, Tq, Dv)
        out = out.transpose(1, 2).reshape(B, Tq, self.v_dim)  # merge heads: (B, Tq, H*Dv)
        record("attn.merge_heads", out)
        out = self.out_proj(out)  # (B, Tq, out_dim)
        record("attn.out_proj", out)
        return out, weights

    def _forward_packed(self, query, key, value, mask, layout, is_causal, need_weights):
        if key is not query or value is not query:
            raise ValueError("packed rows (layout given) support self-attention only")
        if mask is not None:
            raise ValueError(
                "mask must be None on packed rows: the layout already says where each "
                "sequence starts and ends"
            )
        if query.dim() != 2 or query.shape[-1] != self.in_dim:
            raise ValueError(
                f"packed query must have shape (N, in_dim) = (N, {self.in_dim}), "
                f"got {tuple(query.shape)}"
            )
        if query.shape[0] != layout.num_tokens:
            raise ValueError(
                f"packed query has {query.shape[0]} rows but the layout holds "
                f"{layout.num_tokens} tokens"
            )
        choice = self.backend_for(need_weights=need_weights, packed=True)
        N, H = query.shape[0], self.n_heads
        q, k, v = self.project(query, query, query)
        # (N, H*Dh) -> (N, H, Dh); explicit widths, so that a batch of no tokens (N = 0) works.
        dh, dv = self.qk_dim // H, self.v_dim // H
        q, k, v = q.view(N, H, dh), k.view(N, H, dh), v.view(N, H, dv)
        out = varlen_attention(
            q,
            k,
            v,
            layout,
            is_causal=is_causal,
            dropout_p=self.attn_dropout if self.training else 0.0,
            reference=choice.name == "math",
        )  # (N, H, Dv)
        return self.out_proj(out.reshape(N, self.v_dim)), None

    def _check_padded_inputs(self, query: Tensor, key: Tensor, value: Tensor) -> None:
        for t, name, width, width_name in (
            (query, "query", self.in_dim, "in_dim"),
            (key, "key", self.kv_dim, "kv_dim"),
            (value, "value", self.kv_dim, "kv_dim"),
        ):
            if not isinstance(t, Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
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
        return (
            f"in_dim={self.in_dim}, qk_dim={self.qk_dim}, v_dim={self.v_dim}, "
            f"out_dim={self.out_dim}, n_heads={self.n_heads}, attn_dropout={self.attn_dropout}, "
            f"backend={self.backend!r}"
        )
