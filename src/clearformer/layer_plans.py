"""The plans of a stack's layers that differ from the call's: local windows and rotary tables.

A stack whose layers are all alike runs the call's plan everywhere. A stack with local and
global layers (ModernBERT), or with rotary positions, gets one plan per layer type, derived
from the call's plan once and shared by every layer of that type (``ForwardPlan.layer(i)``):
the band of a local layer (folded into the mask of short padded rows; applied slab by slab on
long ones, per sequence on packed rows) and the rotary tables of each rotary base.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from . import masks
from .forward_plan import ForwardPlan, positions_of
from .options import Decision
from .positions import rotary_tables
from .routes import slab_by_slab, varlen_method

__all__ = ["check_contiguous", "layer_plan", "with_layers", "with_score_bias"]


def with_layers(
    base: ForwardPlan,
    layers: tuple[tuple[int | None, float | None], ...],
    head_dim: int | None,
    is_causal: bool,
    dtype: torch.dtype = torch.float32,
    score_bias: bool = False,
    grouped: bool = False,
) -> ForwardPlan:
    """``base`` with one plan per distinct layer type (window, rotary base), built once each.
    ``dtype``, ``score_bias`` and ``grouped`` tell the routes what a local layer's varlen
    method must take."""
    if all(window is None and theta is None for window, theta in layers):
        return base
    if base.token_mask is not None and any(window is not None for window, _ in layers):
        check_contiguous(base.token_mask)
    positions = positions_of(base)
    built: dict[tuple[int | None, float | None], ForwardPlan] = {}
    for kind in layers:
        if kind not in built:
            built[kind] = layer_plan(
                base,
                *kind,
                positions,
                head_dim,
                is_causal,
                dtype=dtype,
                score_bias=score_bias,
                grouped=grouped,
            )
    return dataclasses.replace(base, per_layer=tuple(built[kind] for kind in layers))


def with_score_bias(plan: ForwardPlan, bias: Tensor) -> ForwardPlan:
    """``plan`` (and each of its layers' plans) adding ``bias`` (H, L, L) to every score.

    The stack that owns the bias attaches it per call (it is a parameter); its planning chose
    varlen methods that take a bias (``plan_stack(score_bias=True)``) and checked that the mask
    is contiguous (:func:`check_contiguous`).
    """
    layers = tuple(dataclasses.replace(p, score_bias=bias) for p in plan.per_layer)
    return dataclasses.replace(plan, score_bias=bias, per_layer=layers)


def check_contiguous(token_mask: Tensor, what: str = "local (windowed) attention") -> None:
    """A local window counts distances in positions; on the padded layout it reads them off
    the row index, which agrees with the packed layout only when each sequence's tokens are one
    contiguous run (right or left padding). A mask with holes is refused, not run two ways."""
    if torch.compiler.is_compiling():
        return
    starts = token_mask[:, :1].sum(1) + (token_mask[:, 1:] & ~token_mask[:, :-1]).sum(1)  # (B,)
    holed = (starts > 1).nonzero().flatten().tolist()
    if holed:
        raise ValueError(
            f"mask must hold each sequence's real tokens as one contiguous run for {what}; "
            f"rows {holed[:8]} have gaps"
        )


def layer_plan(
    base: ForwardPlan,
    window: int | None,
    theta: float | None,
    positions: Tensor,
    head_dim: int | None,
    is_causal: bool,
    *,
    dtype: torch.dtype = torch.float32,
    score_bias: bool = False,
    grouped: bool = False,
) -> ForwardPlan:
    rotary = None
    if theta is not None:
        if head_dim is None:
            raise ValueError("rotary positions need head_dim, the width of their tables")
        cos, sin = rotary_tables(positions, head_dim, theta)  # P + (Dh,)
        # Broadcast over heads: packed (N, 1, Dh); padded (B, 1, T, Dh).
        rotary = (
            (cos.unsqueeze(-2), sin.unsqueeze(-2))
            if base.packed
            else (
                cos.unsqueeze(1),
                sin.unsqueeze(1),
            )
        )
    if window is None:
        return dataclasses.replace(base, rotary=rotary)
    if base.packed:
        method = base.method
        if method is not None and method.choice != "math":
            # The routes ask each method whether it takes a window (one rule, in each method).
            method = varlen_method(
                base.packing,
                device=base.device,
                dtype=dtype,
                head_dim=head_dim,
                is_causal=is_causal,
                window=window,
                bias=score_bias,
                grouped=grouped,
            )
        return dataclasses.replace(base, window=window, rotary=rotary, method=method)
    if base.kernel.choice == "sdpa" and slab_by_slab(base.tq, window):
        # Long rows: the kernel goes slab by slab, so no (T, T) band is ever built here. It
        # reads the key-padding mask alone and applies the causal flag itself.
        keys = None if base.token_mask is None else base.token_mask[:, None, None, :]
        return dataclasses.replace(
            base,
            mask=keys,
            query_has_key=None,
            is_causal=is_causal,  # the base may have folded it into the mask dropped here
            window=window,
            rotary=rotary,
        )
    # Padded: fold the band into the mask once for all layers of this type. A padded query
    # farther than the window from every real key has no key: its row is zeroed by the kernel.
    mask = base.mask
    if base.is_causal:
        mask = masks.fold_causal(mask, base.tq, base.tk, base.device)
    band = masks.band_mask(base.tq, window, base.device)  # (1, 1, T, T)
    mask = band if mask is None else mask & band
    return dataclasses.replace(
        base,
        mask=mask,
        is_causal=False,
        query_has_key=masks.rows_with_key(mask, base.device),
        window=window,
        band_in_mask=True,
        rotary=rotary,
    )


def with_linear(plan: ForwardPlan, linear: Decision) -> ForwardPlan:
    """``plan`` (and each of its layers' plans) running the linear layers as ``linear`` says
    (:func:`clearformer.routes.linear_route`)."""
    layers = tuple(dataclasses.replace(p, linear=linear) for p in plan.per_layer)
    return dataclasses.replace(plan, linear=linear, per_layer=layers)
