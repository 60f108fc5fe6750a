"""The forward plan: what one call runs, decided once, before any work, at the stack's edge.

A call is planned once: its mask is validated once, the layout (padded rows with a mask, or
packed rows with ``cu_seqlens``) and the attention kernel are chosen, each with its reason, and
what every layer would otherwise recompute (the causal fold, which queries have a key, the
varlen method) is computed here. Blocks and attention receive the plan and trust it.

The plan is a frozen value made per call, never state on a module: the same model can serve
packed batches in one thread while another thread explains it on the reference kernel.

Where later capabilities plug in, all on this one seam: per-token positions for rotary tables
(``ForwardPlan.positions``), per-layer attention types (a global or a windowed mask per layer
type, built here once), a causal flag (``is_causal``), a cross-attention memory layout and a
key/value cache (one more layout, planned and returned explicitly).
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import masks
from .checks import check_choice
from .dtypes import check_rows_dtype, compute_dtype
from .forward_plan import ForwardPlan, Route
from .layer_plans import with_layers
from .options import BACKENDS, Decision
from .padding import PackedLayout, pack_layout
from .routes import PACK_MIN_PADDING, stack_layout, varlen_method, weights_kernel

__all__ = [
    "Decision",
    "ForwardPlan",
    "Route",
    "check_rows_dtype",
    "plan_attention",
    "plan_stack",
    "PACK_MIN_PADDING",
]


def plan_stack(
    mask: Tensor | None,
    *,
    shape: tuple[int, int],
    device: torch.device,
    backend: str = "auto",
    is_causal: bool = False,
    need_weights: bool = False,
    output_hidden_states: bool = False,
    checkpointing: bool = False,
    mask_name: str = "mask",
    dtype: torch.dtype | None = None,
    head_dim: int | None = None,
    layers: tuple[tuple[int | None, float | None], ...] = (),
    packing: PackedLayout | None = None,
    score_bias: bool = False,
    grouped: bool = False,
) -> ForwardPlan:
    """Plan one call of a stack on a (B, T) batch with an optional (B, T) key-padding mask,
    or on rows the caller packed already (``packing``).

    Args:
        mask: (B, T) bool, True = real token; None = every position is real.
        shape: the batch shape (B, T).
        device: the input's device.
        backend: ``auto`` (packed when enough of the batch is padding) or a kernel by name.
        is_causal: token i attends to tokens j <= i of its own sequence.
        need_weights: every layer returns its attention probabilities (``math`` kernel).
        output_hidden_states: the call returns every layer's hidden states.
        checkpointing: recompute every block's activations in backward (training calls).
        mask_name: how errors name the mask (the caller's argument name).
        dtype: the rows' dtype (which varlen implementations can serve them); None = the
            autocast dtype when autocast is on, else float32.
        head_dim: the attention heads' width (which varlen implementations can serve them;
            the width of rotary tables).
        layers: per layer, ``(window, rotary theta)``: a local layer's half-window (None:
            global) and its rotary base (None: no rotary positions). Empty: every layer global,
            without rotary positions.
        score_bias: the stack adds a score bias (the varlen method must take one).
        grouped: keys and values have fewer heads than queries (grouped-query attention; the
            varlen method must read grouped keys).

    Raises:
        TypeError, ValueError: a bad mask or backend, or a backend that cannot serve the call.
    """
    check_choice(backend, BACKENDS, "backend")
    dtype = compute_dtype(device, dtype)
    if packing is not None:
        return _plan_packed_rows(
            packing,
            mask,
            backend,
            device,
            dtype,
            head_dim,
            layers,
            is_causal,
            need_weights,
            output_hidden_states,
            checkpointing,
            score_bias,
            grouped,
        )
    B, T = shape
    masks.prepare_attention_mask(
        mask, batch=B, heads=1, tq=T, tk=T, device=device, key_padding_only=True, name=mask_name
    )
    compiling = torch.compiler.is_compiling()
    if mask is not None and not compiling and bool(mask.all()):
        # Nothing is padding: the unmasked kernels are faster and nothing needs zeroing. (Under
        # torch.compile the check would break the graph; the mask stays.)
        mask = None
    flags = dict(
        need_weights=need_weights,
        output_hidden_states=output_hidden_states,
        checkpointing=checkpointing,
    )

    layout, kernel = stack_layout(
        mask, backend, need_weights=need_weights, compiling=compiling, dtype=dtype
    )

    if layout.choice == "packed":
        keep = mask if mask is not None else torch.ones(B, T, dtype=torch.bool, device=device)
        packing = pack_layout(keep)
        method = varlen_method(
            packing,
            device=device,
            dtype=dtype,
            head_dim=head_dim,
            is_causal=is_causal,
            bias=score_bias,
            grouped=grouped,
        )
        base = ForwardPlan(
            layout,
            kernel,
            method,
            "stack",
            B,
            T,
            T,
            device,
            token_mask=mask,
            packing=packing,
            is_causal=is_causal,
            **flags,
        )
        return with_layers(base, layers, head_dim, is_causal, dtype, score_bias, grouped)
    # Padded: fold the key-padding and causal constraints into one mask, once for all layers.
    # An unmasked causal call keeps the flag instead: sdpa has a fast causal path.
    fold = is_causal and mask is not None
    full = None if mask is None else mask[:, None, None, :]  # (B, 1, 1, T) keys
    if fold:
        full = masks.fold_causal(full, T, T, device)
    base = ForwardPlan(
        layout,
        kernel,
        None,
        "stack",
        B,
        T,
        T,
        device,
        token_mask=mask,
        mask=full,
        query_has_key=masks.rows_with_key(full, device),
        is_causal=is_causal and not fold,
        **flags,
    )
    return with_layers(base, layers, head_dim, is_causal, dtype, score_bias, grouped)


def _plan_packed_rows(
    packing: PackedLayout,
    mask: Tensor | None,
    backend: str,
    device: torch.device,
    dtype: torch.dtype,
    head_dim: int | None,
    layers: tuple[tuple[int | None, float | None], ...],
    is_causal: bool,
    need_weights: bool,
    output_hidden_states: bool,
    checkpointing: bool,
    score_bias: bool,
    grouped: bool,
) -> ForwardPlan:
    if mask is not None:
        raise ValueError(
            "mask must be None with cu_seqlens: the packed rows hold real tokens only, and "
            "cu_seqlens says where each sequence starts and ends"
        )
    if need_weights:
        raise ValueError(
            "output_attentions=True on packed rows: attention weights are (B, H, T, T) on the "
            "padded layout; pass (B, T) ids with a mask and backend='math'"
        )
    if backend == "sdpa":
        raise ValueError(
            "backend='sdpa' runs on the padded layout, got packed rows (cu_seqlens); use "
            "backend='auto' or 'varlen' (fused), or 'math' (the reference formula)"
        )
    layout = Decision("packed", "the caller gave packed rows and their cu_seqlens")
    if backend == "math":
        kernel, method = Decision("math", "requested by name: reference formula per sequence"), None
    else:
        kernel = Decision("varlen", "packed rows: only varlen attention reads cu_seqlens")
        method = varlen_method(
            packing,
            device=device,
            dtype=dtype,
            head_dim=head_dim,
            is_causal=is_causal,
            bias=score_bias,
            grouped=grouped,
        )
    base = ForwardPlan(
        layout,
        kernel,
        method,
        "stack",
        packing.batch,
        packing.seqlen,
        packing.seqlen,
        device,
        packing=packing,
        is_causal=is_causal,
        output_hidden_states=output_hidden_states,
        checkpointing=checkpointing,
        packed_input=True,
    )
    return with_layers(base, layers, head_dim, is_causal, dtype, score_bias, grouped)


def plan_attention(
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
    grouped: bool = False,
) -> ForwardPlan:
    """Plan one call of a lone attention module or block (no stack to pack for it).

    Args:
        mask: bool, True = takes part: (B, Tk), (B, Tq, Tk) or (B, H, Tq, Tk); or None.
        packing: the layout of packed (N, D) rows the caller already unpadded; then ``mask``
            must be None (the layout says where every sequence starts and ends).

    Raises:
        TypeError, ValueError: a bad mask or backend, or a backend that cannot serve the call.
    """
    check_choice(backend, BACKENDS, "backend")
    if packing is not None:
        if mask is not None:
            raise ValueError(
                "mask must be None on packed rows: the layout already says where each "
                "sequence starts and ends"
            )
        if need_weights:
            raise ValueError(
                "need_weights=True on packed rows: weights need the padded layout and the "
                "'math' backend; run the stack with backend='math'"
            )
        if backend == "sdpa":
            raise ValueError(
                "backend='sdpa' runs on the padded layout, got packed rows (a layout); use "
                "backend='varlen' or 'auto' for packed rows, or pass (B, T, D) rows with a mask"
            )
        if backend == "math":
            kernel = Decision("math", "packed rows, reference formula per sequence")
            method = None
        else:
            kernel = Decision("varlen", "rows are packed; only varlen attention reads cu_seqlens")
            method = varlen_method(
                packing,
                device=device,
                dtype=compute_dtype(device, dtype),
                head_dim=head_dim,
                is_causal=is_causal,
                grouped=grouped,
            )
        layout = Decision("packed", "the caller gave packed rows and their layout")
        return ForwardPlan(
            layout,
            kernel,
            method,
            "layer",
            packing.batch,
            packing.seqlen,
            packing.seqlen,
            device,
            packing=packing,
            is_causal=is_causal,
        )
    if need_weights:
        kernel = weights_kernel(backend)
    elif backend == "varlen":
        raise ValueError(
            "backend='varlen' runs on packed rows: pass (N, in_dim) rows with a layout from "
            "clearformer.padding.unpad, or use Encoder, which packs at the stack's edge; "
            "for a padded (B, T, D) batch use backend='sdpa' or 'auto'"
        )
    elif backend == "auto":
        kernel = Decision("sdpa", "fused kernel, no weights requested, padded layout")
    else:
        kernel = Decision(backend, "requested by name")
    # sdpa's own causal path serves only an unmasked square call; otherwise fold it in once.
    fold = is_causal and (mask is not None or tq != tk)
    full = masks.prepare_attention_mask(
        mask, batch=batch, heads=heads, tq=tq, tk=tk, device=device, is_causal=fold
    )
    return ForwardPlan(
        Decision("padded", "a lone layer runs on the rows it is given"),
        kernel,
        None,
        "layer",
        batch,
        tq,
        tk,
        device,
        mask=full,
        query_has_key=masks.rows_with_key(full, device),
        key_in_use=masks.keys_in_use(full, device),
        is_causal=is_causal and not fold,
        need_weights=need_weights,
    )
