"""Planning a lone attention module or block, and a decoder call: one layer's plan (or the
self- and cross-attention pair of a decoder), made the way :func:`clearformer.plan.plan_stack`
plans a stack's layers, but on the rows the layer is given (no stack to pack them for)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from . import masks, routes
from .checks import check_choice
from .dtypes import compute_dtype
from .forward_plan import LayerPlan
from .options import BACKENDS, Decision
from .padded_keys import padded_route
from .padding import PackedLayout
from .routes import VarlenCall

__all__ = ["plan_decoder", "plan_layer"]


def plan_layer(
    mask: Tensor | None,
    *,
    batch: int,
    heads: int,
    tq: int,
    tk: int,
    device: torch.device,
    backend: str = "auto",
    is_causal: bool = False,
    need_weights: bool = False,
    packing: PackedLayout | None = None,
    dtype: torch.dtype | None = None,
    head_dim: int | None = None,
    value_dim: int | None = None,
    grouped: bool = False,
    dropout: bool = False,
    rows_apart: bool = False,
    linear: Decision | None = None,
) -> LayerPlan:
    """Plan one call of a lone attention module or block (no stack to pack for it).

    Args:
        mask: bool, True = takes part: (B, Tk), (B, Tq, Tk) or (B, H, Tq, Tk); or None.
        packing: the layout of packed (N, D) rows the caller already unpadded; then ``mask``
            must be None (the layout says where every sequence starts and ends).
        dropout: dropout applies to the attention probabilities (a module in training).
        rows_apart: the layer norms queries and keys per head (new tensors, not views).
        value_dim: the values' head width where it differs from ``head_dim``.
        linear: how the linear layers run (a decoder's route); None: eager.

    Raises:
        TypeError, ValueError: a bad mask or backend, or a backend that cannot serve the call.
    """
    check_choice(backend, BACKENDS, "backend")
    dtype = compute_dtype(device, dtype)
    call = VarlenCall(
        device,
        dtype,
        head_dim,
        is_causal,
        dropout=dropout,
        grad=torch.is_grad_enabled(),
        grouped=grouped,
        rows_apart=rows_apart,
        value_dim=value_dim,
    )
    if packing is not None:
        if mask is not None:
            raise ValueError(
                "mask must be None on packed rows: the layout already says where each "
                "sequence starts and ends"
            )
        kernel = routes.packed_rows_kernel(backend, need_weights, lone=True)
        method = None if kernel.choice == "math" else routes.varlen_method(packing, call)
        return LayerPlan(
            Decision("packed", "the caller gave packed rows and their layout"),
            kernel,
            method,
            packing.batch,
            packing.seqlen,
            packing.seqlen,
            device,
            packing=packing,
            is_causal=is_causal,
        )
    kernel = routes.lone_layer_kernel(backend, need_weights)
    # sdpa's own causal path serves only an unmasked square call; otherwise fold it in once.
    fold = is_causal and (mask is not None or tq != tk)
    full = masks.prepare_attention_mask(
        mask, batch=batch, heads=heads, tq=tq, tk=tk, device=device, is_causal=fold
    )
    query_has_key = masks.rows_with_key(full, device)
    is_causal = is_causal and not fold
    route, runs = None, None
    if kernel.choice == "sdpa":
        keys = None
        if full is not None and full.dtype == torch.bool and full.shape == (batch, 1, 1, tk):
            keys = full[:, 0, 0, :]  # (B, Tk); key_runs refuses rows without a key
        route, runs = padded_route(
            call, square=tq == tk, unmasked=full is None and not is_causal, keys=keys
        )
    return LayerPlan(
        Decision("padded", "a lone layer runs on the rows it is given"),
        kernel,
        None,
        batch,
        tq,
        tk,
        device,
        padded_route=route,
        mask=full,
        query_has_key=query_has_key,
        key_in_use=masks.keys_in_use(full, device),
        key_runs=runs,
        is_causal=is_causal,
        need_weights=need_weights,
        linear=linear,
        avx512_linear=routes.epilogue_route(linear, dtype, batch * tq),
    )


def plan_decoder(
    owner: nn.Module,
    mask: Tensor | None,
    memory_mask: Tensor | None,
    *,
    batch: int,
    tq: int,
    past: int,
    memory_length: int,
    heads: int,
    device: torch.device,
    backend: str,
    dtype: torch.dtype,
) -> tuple[LayerPlan, LayerPlan]:
    """The self- and cross-attention plans of a decoder call (``owner``: a block or a stack),
    made once for all its layers.

    Self-attention: ``tq`` new queries over ``past + tq`` keys, causal (query i sees keys
    j <= past + i), target key padding from ``mask``. Cross-attention: ``tq`` queries over
    ``memory_length`` memory keys, key padding from ``memory_mask``. Both carry the linear
    layers' route (the math backend is the reference: always the eager layers).
    """
    check_choice(backend, BACKENDS, "backend")
    if backend == "varlen":
        raise ValueError(
            "backend='varlen' runs on packed rows; the decoder runs on the padded layout: "
            "use 'auto', 'sdpa' or 'math'"
        )
    linear = None
    if backend != "math":
        linear = routes.linear_route(device, dtype, owner.training, owner)
    common = dict(batch=batch, heads=heads, device=device, backend=backend, dtype=dtype)
    self_plan = plan_layer(
        mask,
        tq=tq,
        tk=past + tq,
        # One new token sees every earlier one: no constraint left to apply.
        is_causal=tq > 1,
        linear=linear,
        **common,
    )
    cross_plan = plan_layer(memory_mask, tq=tq, tk=memory_length, linear=linear, **common)
    return self_plan, cross_plan
