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
blocks, attention and kernels trust it. :func:`~clearformer.plan_lone.plan_layer` plans a lone
attention module or block the same way, :func:`~clearformer.plan_lone.plan_decoder` a decoder
call's self- and cross-attention (both in :mod:`clearformer.plan_lone`, re-exported here), and
:mod:`clearformer.padded_keys` says which kernel a padded layer's attention takes.

The plan is a value made per call, never state on a module: the same model can serve packed
batches in one thread while another thread explains it on the reference kernel.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from . import dtypes, masks, routes
from .checks import check_bool, check_choice
from .dtypes import compute_dtype
from .forward_plan import CallPlan, ForwardPlan, LayerPlan
from .machine import machine
from .options import BACKENDS, Decision
from .padded_keys import key_runs, padded_route
from .padding import PackedLayout, layout_from_cu_seqlens, pack_layout
from .plan_lone import plan_decoder, plan_layer
from .positions import head_rotary, sequence_positions
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
    "key_runs",
    "plan_decoder",
    "plan_layer",
    "plan_stack",
]


@dataclass(frozen=True)
class Rows:
    """The rows a call is given, described: their padded shape (B, T), device and dtype
    (None: the autocast dtype under autocast, else float32)."""

    batch: int
    length: int
    device: torch.device
    dtype: torch.dtype | None = None

    @staticmethod
    def described(
        mask: Tensor | None,
        shape: tuple[int, int] | None,
        device: torch.device | None,
        dtype: torch.dtype | None,
        cu_seqlens: Tensor | None = None,
    ) -> Rows:
        """Rows of ``shape`` on ``device``, each defaulting to the (B, T) mask's; rows packed
        by the caller take both from their ``cu_seqlens`` (checked by the planner)."""
        if cu_seqlens is not None:
            return Rows(0, 0, getattr(cu_seqlens, "device", torch.device("cpu")), dtype)
        if shape is None or device is None:
            if not isinstance(mask, Tensor):
                raise TypeError(
                    "shape and device must be given unless mask is a (B, T) tensor, got "
                    f"mask={type(mask).__name__}"
                )
            if shape is None:
                # A mask of the wrong rank still gets its shape error from the mask check.
                dims = tuple(mask.shape) or (0,)
                shape = (dims[0], dims[-1])
            device = mask.device if device is None else device
        return Rows(*shape, device, dtype)


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

    @staticmethod
    def checked(**asked) -> Ask:
        """An :class:`Ask` whose flags are checked to be real bools (``"no"`` would read as
        True) and whose backend is one of ``BACKENDS``."""
        ask = Ask(**asked)
        check_choice(ask.backend, BACKENDS, "backend")
        names = ("need_weights", "output_hidden_states", "checkpointing", "rows_alone")
        spelled = {"need_weights": "output_attentions"}
        for name in names:
            check_bool(getattr(ask, name), spelled.get(name, name))
        return ask


def plan_stack(
    encoder: nn.Module,
    rows: Tensor | Rows,
    mask: Tensor | None,
    ask: Ask | None,
    *,
    cu_seqlens: Tensor | None = None,
    given: CallPlan | None = None,
) -> CallPlan:
    """Plan one call of ``encoder`` (an :class:`~clearformer.encoder.Encoder`) on ``rows``: the
    input itself ((B, T, D), or (N, D) packed rows with their ``cu_seqlens``), checked here,
    or a description of it; ``mask`` is an optional (B, T) key-padding mask (True = real
    token); ``ask``, what the call asks for.

    ``given``: a plan made earlier by ``plan_for`` for these rows (then ``ask`` is None): it is
    checked against them and returned as it is; where this call runs in another mode than the
    plan was made in (gradients, training mode: the plan's routes may be inference-only or skip
    dropout), or the plan fuses the linear layers and this call needs the eager ones (forward
    hooks added since), the call gets a new plan for the same rows, layout and kernel, whose
    routes are its own. A plan is never changed after it is made.

    Raises:
        TypeError, ValueError: bad rows, a bad mask or backend, or a backend that cannot serve
            the call.
    """
    config = encoder.config
    compiling = torch.compiler.is_compiling()
    if not isinstance(rows, Tensor | Rows):
        raise TypeError(f"x must be a torch.Tensor, got {type(rows).__name__}")
    if given is not None and not isinstance(given, CallPlan):
        raise ValueError(
            f"plan must be a stack's plan (from Encoder.plan_for), got a "
            f"{type(given).__name__}: a plan made for one layer does not say which rows are "
            "padding"
        )

    # 0. The linear layers' route for this call's mode and rows. The math kernel is the
    # reference: always the eager layers (asked for by name, or for the attention weights).
    reference = given.kernel.choice == "math" if given is not None else ask.backend == "math"
    linear = None
    if not (reference or (ask is not None and ask.need_weights)):
        dtype = rows.dtype or torch.float32
        linear = routes.linear_route(rows.device, dtype, encoder.training, encoder)
    if given is not None:
        packing = given.packing if given.packed_input else None
        dtypes.check_rows(rows, "x", encoder, config.d_model, packing)
        if packing is not None:
            want, got = (packing.num_tokens,), tuple(rows.shape[:1])
        else:
            want, got = (given.batch, given.tq), tuple(rows.shape[:2])
        if want != got or given.device != rows.device:
            raise ValueError(
                f"plan was made for a batch of (B, T) = ({given.batch}, {given.tq}) on "
                f"{given.device}, got x of shape {tuple(rows.shape)} on {rows.device}"
            )
        same_mode = given.mode is None or given.mode == _mode(encoder)
        if same_mode and (not given.fused_linear or linear is None or linear.choice == "fused"):
            return given
        # Planned again for this call: the same rows, layout and kernel, its own linear route.
        ask = Ask(
            backend=given.kernel.choice,
            output_hidden_states=given.output_hidden_states,
            checkpointing=given.checkpointing,
        )
        mask, cu_seqlens = given.token_mask, None if packing is None else packing.cu_seqlens

    # 1. The rows and the mask, checked once for every layer.
    packing = None if cu_seqlens is None else layout_from_cu_seqlens(cu_seqlens)
    if isinstance(rows, Rows):
        device, dtype = rows.device, compute_dtype(rows.device, rows.dtype)
        batch, length = (
            (rows.batch, rows.length) if packing is None else (packing.batch, packing.seqlen)
        )
    else:
        dtype = dtypes.check_rows(rows, "x", encoder, config.d_model, packing)
        device = rows.device
        batch, length = rows.shape[:2] if packing is None else (packing.batch, packing.seqlen)
    if packing is not None:
        if mask is not None:
            raise ValueError(
                "mask must be None with cu_seqlens: the packed rows hold real tokens only, and "
                "cu_seqlens says where each sequence starts and ends"
            )
        device = cu_seqlens.device
    else:
        masks.prepare_attention_mask(
            mask,
            batch=batch,
            heads=1,
            tq=length,
            tk=length,
            device=device,
            key_padding_only=True,
            name=ask.mask_name,
        )
        if mask is not None and not compiling and bool(mask.all()):
            # Nothing is padding: the unmasked kernels are faster and nothing needs zeroing.
            # (Under torch.compile the check would break the graph; the mask stays.)
            mask = None

    # 2. The layout and the kernel.
    if packing is not None:
        layout = Decision("packed", "the caller gave packed rows and their cu_seqlens")
        kernel = routes.packed_rows_kernel(ask.backend, ask.need_weights)
        token_mask = None
    else:
        layout, kernel = routes.stack_layout(
            mask,
            ask.backend,
            need_weights=ask.need_weights,
            compiling=compiling,
            rows_alone=ask.rows_alone,
        )
        token_mask = mask
    # 3. The packed rows' layout.
    if layout.choice == "packed" and packing is None:
        keep = mask
        if keep is None:
            keep = torch.ones(batch, length, dtype=torch.bool, device=device)
        packing = pack_layout(keep)

    # 4. How each kind of layer runs, and the linear layers (the routes' choices, together).
    dropout = config.dropout if config.attn_dropout is None else config.attn_dropout
    call = VarlenCall(
        device,
        dtype,
        config.head_width,
        config.causal,
        bias=encoder.relative_bias is not None,
        dropout=encoder.training and dropout > 0.0,
        grad=torch.is_grad_enabled(),
        grouped=config.kv_heads != config.n_heads,
        rows_apart=config.qk_norm,
    )
    kinds = tuple((config.window_of(t), config.rope_theta_of(t)) for t in config.layer_types)
    padded = layout.choice == "padded"
    attention = {
        kind: _attention_route(call, kernel, packing, token_mask, *kind, length=length)
        for kind in dict.fromkeys(kinds)
    }
    if kernel.choice == "sdpa" and not compiling:
        kernel = Decision("sdpa", kernel.reason + routes.sdpa_note(call))
    if kernel.choice == "math":
        linear = None
    products_rows = packing.num_tokens if packing is not None else batch * length
    avx512_linear = routes.epilogue_route(linear, dtype, products_rows)
    if linear is not None and linear.choice == "fused" and machine().avx512_available:
        # A fused route's reason carries the linear kernel's verdicts on such a CPU
        # (routes.linear_route); they hold for float32 products with an epilogue: say what
        # this call's products take.
        took = (
            "products with an exact GELU or a LayerNorm epilogue (where the model has them) on "
            "clearformer's AVX-512 kernel, the others on oneDNN"
            if avx512_linear
            else "every product on oneDNN"
        )
        linear = Decision(linear.choice, f"{linear.reason}; this call: {took}", impl=linear.impl)

    # 5. What each kind of layer means: its mask (causal fold, band), its rotary tables.
    windowed = any(window is not None for window, _ in kinds)
    if token_mask is not None and (windowed or call.bias):
        # Distances are read off the row index on the padded layout.
        what = "local (windowed) attention" if windowed else "a relative position bias"
        check_contiguous(token_mask, what)
    positions = None
    if any(theta is not None for _, theta in kinds):
        positions = sequence_positions(packing, token_mask, batch, length, device)
    common = dict(
        layout=layout,
        kernel=kernel,
        batch=batch,
        tq=length,
        tk=length,
        device=device,
        packing=packing,
        need_weights=ask.need_weights,
        score_bias=call.bias,
        linear=linear,
        avx512_linear=avx512_linear,
    )
    built: dict[tuple[int | None, float | None], LayerPlan] = {}
    for window, theta in attention:
        rotary = None
        if theta is not None:
            rotary = head_rotary(positions, config.head_width, theta, packed=not padded)
        route = dict(attention[window, theta])
        slab = route.pop("slab", False)
        meaning = masks.layer_masks(token_mask, length, device, config.causal, window, slab, padded)
        built[window, theta] = LayerPlan(
            **common, **route, **meaning, causal=config.causal, window=window, rotary=rotary
        )
    return CallPlan(
        layout,
        kernel,
        batch,
        length,
        device,
        token_mask=token_mask,
        packing=packing,
        packed_input=cu_seqlens is not None,
        need_weights=ask.need_weights,
        output_hidden_states=ask.output_hidden_states,
        checkpointing=ask.checkpointing,
        score_bias=call.bias,
        linear=linear,
        layers=tuple(built[kind] for kind in kinds),
        mode=_mode(encoder),
    )


def _mode(encoder: nn.Module) -> tuple[bool, bool]:
    """What a plan's routes depend on beyond the rows: gradients enabled, training mode."""
    return (torch.is_grad_enabled(), encoder.training)


def _attention_route(
    call: VarlenCall,
    kernel: Decision,
    packing: PackedLayout | None,
    token_mask: Tensor | None,
    window: int | None,
    theta: float | None,
    *,
    length: int,
) -> dict:
    """How one kind of layer attends: the varlen method on packed rows; on padded rows under
    ``sdpa``, clearformer's AVX-512 kernel or PyTorch's (``padded_route``), with the key runs
    it reads."""
    # Rotary positions and per-head norms make new queries and keys; values stay views.
    if window is not None or (theta is not None and not call.rows_apart):
        call = dataclasses.replace(
            call, window=window is not None, rows_apart=call.rows_apart or theta is not None
        )
    if kernel.choice == "varlen":
        return dict(method=routes.varlen_method(packing, call))
    if kernel.choice != "sdpa":
        return dict(method=None)
    if window is not None:
        # Long rows of a local layer go slab by slab: no (T, T) band; unmasked rows may take
        # the flash kernel, which reads the window itself.
        slab = routes.slab_by_slab(length, window)
        if token_mask is None:
            route, _ = padded_route(call, square=True, unmasked=True, keys=None)
            if route.choice == "avx512":
                return dict(method=None, slab=slab, padded_route=route)
        return dict(method=None, slab=slab)
    route, runs = padded_route(call, square=True, unmasked=token_mask is None, keys=token_mask)
    return dict(method=None, padded_route=route, key_runs=runs)


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
