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

from dataclasses import dataclass

import torch
from torch import Tensor

from . import masks
from .checks import check_choice
from .dtypes import check_rows_dtype, compute_dtype
from .kernels.varlen import resolve_method
from .layer_plans import positions_of, with_layers
from .options import BACKENDS, KERNEL_NAMES, LAYOUTS, Decision
from .padding import PackedLayout, pack_layout

__all__ = [
    "Decision",
    "ForwardPlan",
    "check_rows_dtype",
    "plan_attention",
    "plan_stack",
    "PACK_MIN_PADDING",
]

# Packing costs one gather and one scatter of (N, D), and attention then needs one call per run
# of equally long sequences or a gather to a padded copy: below this fraction of padding the
# padded layout is as fast (measured break-even between 5 and 8.5 %, docs/performance.md).
PACK_MIN_PADDING = 0.06


@dataclass(frozen=True, eq=False)
class ForwardPlan:
    """Everything the layers of one call need to know besides their input rows.

    Attributes:
        layout: ``padded`` ((B, T, D) rows, ``mask`` applies) or ``packed`` ((N, D) rows).
        kernel: ``math``, ``sdpa`` or ``varlen``.
        method: on packed rows, how ``varlen`` attends (see clearformer.kernels.varlen).
        scope: ``stack`` (made by :func:`plan_stack` for a whole stack) or ``layer`` (made by
            :func:`plan_attention` for one lone layer); a stack accepts only its own kind.
        batch, tq, tk: the padded shape of the call (queries and keys).
        device: where the call's rows live.
        token_mask: (B, T) bool key-padding mask of a stack call, True = real token; None when
            every position is real. The stack zeroes its padded output rows with it.
        mask: padded layout: bool, broadcastable to (B, H, Tq, Tk), True = may attend, causal
            constraint folded in; None = attend everywhere.
        query_has_key: (B, H|1, Tq|1, 1) bool, whether a query row has any key; None when
            every row has one (known without looking at the device) or no mask is given.
        key_in_use: (B, H|1, Tk, 1) bool, whether any query may attend a key, for a lone layer
            whose mask leaves some key unused (its key and value are zeroed, so that a NaN
            there cannot reach a real query); None otherwise. A stack needs none: it zeroes
            padded rows once at its entry.
        packing: packed layout: where each sequence's rows are (``cu_seqlens``, offsets).
        is_causal: the kernel still has to apply the causal constraint itself (packed rows,
            or a padded call whose causal triangle was not folded into ``mask``).
        need_weights: return attention probabilities (``math`` only).
        output_hidden_states: return every layer's hidden states.
        checkpointing: recompute each block's activations in the backward pass instead of
            keeping them (memory for time; a training call's choice). The stack applies it only
            in training mode with gradients enabled.
        window: local attention: query i sees keys j of its sequence with |i - j| <= window;
            None = global attention.
        band_in_mask: the window is folded into ``mask`` (padded, short sequences or the
            ``math`` kernel); otherwise the kernel applies it itself: slab by slab on long
            padded rows (:mod:`clearformer.kernels.local`), per sequence on packed rows.
        rotary: (cos, sin) float32 tables for rotary positions, shaped to broadcast over the
            heads of split queries and keys ((N, 1, Dh) packed, (B, 1, T, Dh) padded).
        score_bias: (H, L, L) float added to every layer's scores (a relative position bias,
            :mod:`clearformer.relative_bias`), L the padded length or the longest packed
            sequence; a sequence of length l starting at position 0 reads its top-left
            (H, l, l) corner. Attached by the stack that owns the bias; None: no bias.
        packed_input: the caller gave packed rows and their ``cu_seqlens``: the stack returns
            packed rows too, and never sees a padded grid.
        linear: how the linear layers run: ``fused`` (bias, activation and residual add inside
            oneDNN's matrix product, :mod:`clearformer.fused_linear`: CPU inference in
            float32) or ``eager``; None: eager (a plan no stack decided it for).
        per_layer: a stack whose layers differ (local and global layers, rotary bases): the
            plan of each layer, derived from this one and built once per layer type. Empty when
            every layer runs this plan.
    """

    layout: Decision
    kernel: Decision
    method: Decision | None
    scope: str
    batch: int
    tq: int
    tk: int
    device: torch.device
    token_mask: Tensor | None = None
    mask: Tensor | None = None
    query_has_key: Tensor | None = None
    key_in_use: Tensor | None = None
    packing: PackedLayout | None = None
    is_causal: bool = False
    need_weights: bool = False
    output_hidden_states: bool = False
    checkpointing: bool = False
    window: int | None = None
    band_in_mask: bool = False
    rotary: tuple[Tensor, Tensor] | None = None
    score_bias: Tensor | None = None
    packed_input: bool = False
    linear: Decision | None = None
    per_layer: tuple[ForwardPlan, ...] = ()

    def layer(self, index: int) -> ForwardPlan:
        """The plan layer ``index`` of a stack runs."""
        return self.per_layer[index] if self.per_layer else self

    def __post_init__(self) -> None:
        # Decisions speak the vocabulary of clearformer.options, nothing else.
        assert self.layout.choice in LAYOUTS and self.kernel.choice in KERNEL_NAMES, self

    @property
    def packed(self) -> bool:
        return self.packing is not None

    @property
    def fused_linear(self) -> bool:
        """The linear layers run fused (see ``linear``)."""
        return self.linear is not None and self.linear.choice == "fused"

    @property
    def positions(self) -> Tensor:
        """Each row's position within its own sequence, counted over its real tokens: (N,)
        when packed, (B, T) when padded (what rotary tables are built from)."""
        return positions_of(self)

    def check_rows(self, rows: Tensor, name: str = "x") -> None:
        """Raise unless ``rows`` are laid out as this plan says (shape and device)."""
        if self.packing is not None:
            want, form = (self.packing.num_tokens,), "(N,) packed rows"
        else:
            want, form = (self.batch, self.tq), "(B, T)"
        if tuple(rows.shape[: len(want)]) != want or rows.dim() != len(want) + 1:
            raise ValueError(
                f"plan was made for {form} = {want}, got {name} of shape {tuple(rows.shape)}"
            )
        if rows.device != self.device:
            raise ValueError(f"plan was made for device {self.device}, got {name} on {rows.device}")

    def __str__(self) -> str:
        lines = [f"layout: {self.layout}", f"kernel: {self.kernel}"]
        if self.method is not None:
            lines.append(f"varlen method: {self.method}")
        if self.linear is not None:
            lines.append(f"linear layers: {self.linear}")
        kinds: dict[str, list[int]] = {}
        for i, plan in enumerate(self.per_layer):
            what = "global" if plan.window is None else f"local |i - j| <= {plan.window}"
            if plan.rotary is not None:
                what += ", rotary"
            kinds.setdefault(what, []).append(i)
        for what, layers in kinds.items():
            lines.append(f"layers {layers}: {what}")
        return "\n".join(lines)


def _weights_decision(requested: str) -> Decision:
    if requested in ("auto", "math"):
        return Decision("math", "attention weights requested; only the math kernel returns them")
    raise ValueError(
        f"attention weights requested (need_weights / output_attentions): the {requested!r} "
        "backend cannot return attention weights; use backend='math' (or 'auto', which picks "
        "'math' when weights are requested)"
    )


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

    if need_weights:
        kernel = _weights_decision(backend)
        layout = Decision("padded", "attention weights are (B, H, T, T) on the padded layout")
    elif backend in ("math", "sdpa"):
        kernel = Decision(backend, "requested by name")
        layout = Decision("padded", f"the {backend!r} kernel runs on the padded layout")
    elif backend == "varlen":
        if compiling:
            raise ValueError(
                "backend='varlen' packs rows by their data-dependent lengths, which "
                "torch.compile(fullgraph=True) cannot trace; compile with backend='auto' or "
                "'sdpa' (the padded path has static shapes)"
            )
        kernel = Decision("varlen", "requested by name")
        layout = Decision("packed", "the 'varlen' kernel runs on packed rows")
    elif mask is None:
        kernel = Decision("sdpa", "fused kernel, padded layout")
        layout = Decision("padded", "no padding: nothing to unpad")
    elif compiling:
        kernel = Decision("sdpa", "fused kernel, padded layout")
        layout = Decision("padded", "under torch.compile the padded path has static shapes")
    else:
        padding = 1.0 - float(mask.sum()) / max(mask.numel(), 1)
        if padding >= PACK_MIN_PADDING:
            kernel = Decision("varlen", "packed rows: only varlen attention reads cu_seqlens")
            layout = Decision("packed", f"{padding:.0%} of positions are padding")
        else:
            kernel = Decision("sdpa", "fused kernel, padded layout")
            layout = Decision("padded", f"only {padding:.0%} padding: packing would not pay")

    if layout.choice == "packed":
        keep = mask if mask is not None else torch.ones(B, T, dtype=torch.bool, device=device)
        packing = pack_layout(keep)
        method = resolve_method(
            "auto", packing, device=device, dtype=dtype, head_dim=head_dim, is_causal=is_causal
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
        return with_layers(base, layers, head_dim, is_causal)
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
    return with_layers(base, layers, head_dim, is_causal)


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
        method = resolve_method(
            "auto", packing, device=device, dtype=dtype, head_dim=head_dim, is_causal=is_causal
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
    return with_layers(base, layers, head_dim, is_causal)


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
            method = resolve_method(
                "auto",
                packing,
                device=device,
                dtype=compute_dtype(device, dtype),
                head_dim=head_dim,
                is_causal=is_causal,
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
        kernel = _weights_decision(backend)
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
