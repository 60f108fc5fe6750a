"""The planner: what one call runs, decided once, before any work, read top to bottom.

A call is planned once. :func:`plan_stack` takes the stack, the rows it is given, their mask
and what the call asks for, and in one pass:

1. checks the backend and the mask (once, for every layer);
2. asks :mod:`clearformer.routes` for the layout (padded rows with a mask, or packed rows)
   and the attention kernel;
3. packs the rows' layout, where they are packed;
4. asks the routes how the linear layers run (eager, or fused blocks with their epilogue
   kernel);
5. builds each kind of layer once (a global layer, a local window, each rotary base): its
   mask with the causal fold and the band, which queries have a key, its rotary tables, and
   its attention route (the varlen method on packed rows; clearformer's AVX-512 kernel or
   PyTorch's on padded ones);

and returns a frozen :class:`~clearformer.forward_plan.CallPlan` with one
:class:`~clearformer.forward_plan.LayerPlan` per layer. Nothing patches it afterwards, and
blocks, attention and kernels trust it. :func:`plan_layer` plans a lone attention module or
block the same way; :func:`plan_decoder` a decoder call's self- and cross-attention.

The plan is a value made per call, never state on a module: the same model can serve packed
batches in one thread while another thread explains it on the reference kernel.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from . import masks, routes
from .checks import check_choice
from .dtypes import compute_dtype
from .forward_plan import CallPlan, ForwardPlan, LayerPlan, padded_positions
from .options import BACKENDS, Decision
from .padding import PackedLayout, pack_layout
from .positions import rotary_tables
from .routes import PACK_MIN_PADDING, VarlenCall

__all__ = [
    "Ask",
    "CallPlan",
    "Decision",
    "ForwardPlan",
    "LayerPlan",
    "PACK_MIN_PADDING",
    "Rows",
    "check_contiguous",
    "plan_decoder",
    "plan_layer",
    "plan_stack",
]


@dataclass(frozen=True)
class Rows:
    """The rows a call is given: their padded shape (B, T), device and dtype (None: the
    autocast dtype under autocast, else float32), or the layout of rows the caller packed."""

    batch: int
    length: int
    device: torch.device
    dtype: torch.dtype | None = None
    packing: PackedLayout | None = None


@dataclass(frozen=True)
class Ask:
    """What a call asks for.

    Attributes:
        backend: ``auto`` (the routes choose) or a kernel by name.
        need_weights: every layer returns its attention probabilities (``math`` kernel).
        output_hidden_states: the call returns every layer's hidden states.
        checkpointing: recompute every block's activations in backward (training calls).
        rows_alone: each row's result must not depend on the rows beside it (the text
            applications: a batch with padding is packed).
        mask_name: how errors name the mask (the caller's argument name).
    """

    backend: str = "auto"
    need_weights: bool = False
    output_hidden_states: bool = False
    checkpointing: bool = False
    rows_alone: bool = False
    mask_name: str = "mask"


def plan_stack(encoder: nn.Module, rows: Rows, mask: Tensor | None, ask: Ask) -> CallPlan:
    """Plan one call of ``encoder`` (an :class:`~clearformer.encoder.Encoder`) on ``rows``
    with an optional (B, T) key-padding ``mask`` (True = real token).

    Raises:
        TypeError, ValueError: a bad mask or backend, or a backend that cannot serve the call.
    """
    config = encoder.config
    check_choice(ask.backend, BACKENDS, "backend")
    dtype = compute_dtype(rows.device, rows.dtype)
    compiling = torch.compiler.is_compiling()

    # 1-3. The mask, the layout and the kernel.
    if rows.packing is not None:
        if mask is not None:
            raise ValueError(
                "mask must be None with cu_seqlens: the packed rows hold real tokens only, and "
                "cu_seqlens says where each sequence starts and ends"
            )
        packing = rows.packing
        batch, length = packing.batch, packing.seqlen
        layout = Decision("packed", "the caller gave packed rows and their cu_seqlens")
        kernel = routes.packed_rows_kernel(ask.backend, ask.need_weights)
    else:
        batch, length = rows.batch, rows.length
        masks.prepare_attention_mask(
            mask,
            batch=batch,
            heads=1,
            tq=length,
            tk=length,
            device=rows.device,
            key_padding_only=True,
            name=ask.mask_name,
        )
        if mask is not None and not compiling and bool(mask.all()):
            # Nothing is padding: the unmasked kernels are faster and nothing needs zeroing.
            # (Under torch.compile the check would break the graph; the mask stays.)
            mask = None
        layout, kernel = routes.stack_layout(
            mask,
            ask.backend,
            need_weights=ask.need_weights,
            compiling=compiling,
            rows_alone=ask.rows_alone,
        )
        packing = None
        if layout.choice == "packed":
            keep = mask
            if keep is None:
                keep = torch.ones(batch, length, dtype=torch.bool, device=rows.device)
            packing = pack_layout(keep)

    # The facts every layer's attention route reads.
    dropout = config.dropout if config.attn_dropout is None else config.attn_dropout
    call = VarlenCall(
        rows.device,
        dtype,
        config.head_width,
        config.causal,
        bias=encoder.relative_bias is not None,
        dropout=encoder.training and dropout > 0.0,
        grad=torch.is_grad_enabled(),
        grouped=config.kv_heads != config.n_heads,
        rows_apart=config.qk_norm,
    )
    if kernel.choice == "sdpa" and not compiling:
        kernel = Decision("sdpa", kernel.reason + routes.sdpa_note(call))

    # 4. The linear layers (the math kernel is the reference: always the eager layers).
    linear = None
    if kernel.choice != "math":
        linear = routes.linear_route(rows.device, dtype, encoder.training, encoder)
    avx512_linear = routes.epilogue_route(linear, dtype)

    # 5. Each kind of layer once.
    token_mask = mask  # None for rows the caller packed
    kinds = tuple((config.window_of(t), config.rope_theta_of(t)) for t in config.layer_types)
    windowed = any(window is not None for window, _ in kinds)
    if token_mask is not None and (windowed or call.bias):
        # Distances are read off the row index on the padded layout.
        check_contiguous(
            token_mask, "local (windowed) attention" if windowed else "a relative position bias"
        )
    positions = None
    if any(theta is not None for _, theta in kinds):
        positions = _positions(packing, token_mask, batch, length, rows.device)
    common = dict(
        layout=layout,
        kernel=kernel,
        batch=batch,
        tq=length,
        tk=length,
        device=rows.device,
        packing=packing,
        need_weights=ask.need_weights,
        score_bias=call.bias,
        linear=linear,
        avx512_linear=avx512_linear,
    )
    built: dict[tuple[int | None, float | None], LayerPlan] = {}
    for window, theta in kinds:
        if (window, theta) not in built:
            rotary = None
            if theta is not None:
                rotary = _rotary(positions, config.head_width, theta, packed=packing is not None)
            layer_call = dataclasses.replace(
                call, window=window is not None, rows_apart=call.rows_apart or rotary is not None
            )
            built[window, theta] = _stack_layer(
                common, layer_call, token_mask, window, rotary, padded=packing is None
            )
    return CallPlan(
        layout,
        kernel,
        batch,
        length,
        rows.device,
        token_mask=token_mask,
        packing=packing,
        packed_input=rows.packing is not None,
        need_weights=ask.need_weights,
        output_hidden_states=ask.output_hidden_states,
        checkpointing=ask.checkpointing,
        score_bias=call.bias,
        linear=linear,
        layers=tuple(built[kind] for kind in kinds),
    )


def check_given_plan(encoder: nn.Module, plan: object, x: Tensor) -> CallPlan:
    """``plan``, made earlier by ``encoder.plan_for``, for this call of ``encoder`` on ``x``
    (B, T, D): raise unless it is a stack's plan for this shape and device. A plan that fuses
    the linear layers, given to a call that needs the eager ones (gradients, training mode,
    forward hooks added since), is not changed: the call gets a new plan for the same rows,
    layout and kernel, whose linear route is its own."""
    if not isinstance(plan, CallPlan):
        raise ValueError(
            f"plan must be a stack's plan (from Encoder.plan_for), got a "
            f"{type(plan).__name__}: a plan made for one layer does not say which rows are "
            "padding"
        )
    B, T = x.shape[0], x.shape[1]
    if (plan.batch, plan.tq) != (B, T) or plan.device != x.device:
        raise ValueError(
            f"plan was made for a batch of (B, T) = ({plan.batch}, {plan.tq}) on "
            f"{plan.device}, got x of shape {tuple(x.shape)} on {x.device}"
        )
    if plan.fused_linear:
        now = routes.linear_route(x.device, x.dtype, encoder.training, encoder)
        if now.choice != "fused":
            ask = Ask(
                backend=plan.kernel.choice,
                output_hidden_states=plan.output_hidden_states,
                checkpointing=plan.checkpointing,
            )
            return plan_stack(encoder, Rows(B, T, x.device, x.dtype), plan.token_mask, ask)
    return plan


def _stack_layer(
    common: dict,
    call: VarlenCall,
    token_mask: Tensor | None,
    window: int | None,
    rotary: tuple[Tensor, Tensor] | None,
    *,
    padded: bool,
) -> LayerPlan:
    """The plan of one kind of layer of a stack call."""
    kernel, is_causal = common["kernel"], call.is_causal
    if not padded:
        method = None
        if kernel.choice != "math":
            method = routes.varlen_method(common["packing"], call)
        return LayerPlan(method=method, is_causal=is_causal, window=window, rotary=rotary, **common)
    T, device = common["tq"], common["device"]
    keys = None if token_mask is None else token_mask[:, None, None, :]  # (B, 1, 1, T)
    if window is not None and kernel.choice == "sdpa" and routes.slab_by_slab(T, window):
        # Long rows: the kernel goes slab by slab, so no (T, T) band is ever built here. It
        # reads the key-padding mask alone and applies the causal flag itself.
        return LayerPlan(
            method=None, mask=keys, is_causal=is_causal, window=window, rotary=rotary, **common
        )
    # Fold the key-padding, causal and band constraints into one mask, once for all layers of
    # this kind. An unmasked causal global layer keeps the flag instead: sdpa has a fast causal
    # path.
    mask, band_in_mask = keys, False
    if is_causal and (keys is not None or window is not None):
        mask, is_causal = masks.fold_causal(keys, T, T, device), False
    if window is not None:
        # A padded query farther than the window from every real key has no key: its row is
        # zeroed by the kernel.
        band = masks.band_mask(T, window, device)  # (1, 1, T, T)
        mask, band_in_mask = (band if mask is None else mask & band), True
    query_has_key = masks.rows_with_key(mask, device)
    padded_route, runs = None, None
    if kernel.choice == "sdpa" and window is None:
        padded_route, runs = _padded_route(call, token_mask, mask, is_causal)
    return LayerPlan(
        method=None,
        padded_route=padded_route,
        mask=mask,
        query_has_key=query_has_key,
        key_runs=runs,
        is_causal=is_causal,
        window=window,
        band_in_mask=band_in_mask,
        rotary=rotary,
        **common,
    )


def _padded_route(
    call: VarlenCall, token_mask: Tensor | None, mask: Tensor | None, is_causal: bool
) -> tuple[Decision, tuple[Tensor, Tensor] | None]:
    """Whether a padded ``sdpa`` layer's attention takes clearformer's AVX-512 kernel, and
    the (first key, key count) per sequence it reads under a key-padding mask."""
    unmasked = mask is None and not is_causal
    runs = None
    route = routes.padded_attention_route(call, square=True, unmasked=unmasked, key_runs=True)
    if route.choice == "avx512" and not unmasked:
        if mask is not None and mask.shape[1:3] == (1, 1):  # keys only: (B, 1, 1, T)
            runs = key_runs(token_mask)
        if runs is None:
            route = Decision("torch", "keys are not one run per sequence: PyTorch's kernel")
    return route, runs


def key_runs(token_mask: Tensor | None) -> tuple[Tensor, Tensor] | None:
    """(first real key, count) per row of a (B, T) key-padding mask whose real keys are one
    run per row (right or left padding), every row with a key; None otherwise."""
    if token_mask is None:
        return None
    count = token_mask.sum(-1)  # (B,)
    first = token_mask.to(torch.uint8).argmax(-1)  # (B,) first real key
    steps = torch.arange(token_mask.shape[1], device=token_mask.device)
    run = (steps >= first[:, None]) & (steps < (first + count)[:, None])  # (B, T)
    if not bool((count > 0).all()) or not torch.equal(run, token_mask):
        return None
    return first, count


def _positions(
    packing: PackedLayout | None, token_mask: Tensor | None, batch: int, length: int, device
) -> Tensor:
    """Each row's position within its own sequence, counted over real tokens: (N,) packed,
    (B, T) padded (a padded row and the same row packed get the same position)."""
    if packing is not None:
        return packing.positions
    if token_mask is None:
        return torch.arange(length, device=device)[None].expand(batch, length)
    return padded_positions(token_mask)


def _rotary(
    positions: Tensor, head_dim: int, theta: float, *, packed: bool
) -> tuple[Tensor, Tensor]:
    cos, sin = rotary_tables(positions, head_dim, theta)  # P + (Dh,)
    # Broadcast over heads: packed (N, Dh) -> (N, 1, Dh); padded (B, T, Dh) -> (B, 1, T, Dh).
    axis = -2 if packed else 1
    return cos.unsqueeze(axis), sin.unsqueeze(axis)


def check_contiguous(token_mask: Tensor, what: str = "local (windowed) attention") -> None:
    """A local window or a relative bias counts distances in positions; on the padded layout it
    reads them off the row index, which agrees with the packed layout only when each sequence's
    tokens are one contiguous run (right or left padding). A mask with holes is refused, not
    run two ways."""
    if torch.compiler.is_compiling():
        return
    starts = token_mask[:, :1].sum(1) + (token_mask[:, 1:] & ~token_mask[:, :-1]).sum(1)  # (B,)
    holed = (starts > 1).nonzero().flatten().tolist()
    if holed:
        raise ValueError(
            f"mask must hold each sequence's real tokens as one contiguous run for {what}; "
            f"rows {holed[:8]} have gaps"
        )


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
    padded_route, runs = None, None
    if kernel.choice == "sdpa":
        unmasked = full is None and not is_causal
        key_mask = None
        if full is not None and full.dtype == torch.bool and full.shape == (batch, 1, 1, tk):
            key_mask = full[:, 0, 0, :]  # (B, Tk)
        padded_route = routes.padded_attention_route(
            call, square=tq == tk, unmasked=unmasked, key_runs=key_mask is not None
        )
        if padded_route.choice == "avx512" and not unmasked:
            runs = key_runs(key_mask) if query_has_key is None else None
            if runs is None:
                padded_route = Decision("torch", "keys are not one run per sequence")
    return LayerPlan(
        Decision("padded", "a lone layer runs on the rows it is given"),
        kernel,
        None,
        batch,
        tq,
        tk,
        device,
        padded_route=padded_route,
        mask=full,
        query_has_key=query_has_key,
        key_in_use=masks.keys_in_use(full, device),
        key_runs=runs,
        is_causal=is_causal,
        need_weights=need_weights,
        linear=linear,
        avx512_linear=routes.epilogue_route(linear, dtype),
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
