"""The forward plan: one call's meaning and its route, as frozen values.

A plan is made per call (:mod:`clearformer.plan`) and read by every layer; it is never state
on a module. Two values, no mode flag:

* :class:`CallPlan`, a stack call: the batch's shape, device and key-padding mask, the layout
  (padded rows, or packed rows with their ``cu_seqlens``), the outputs asked for, and one
  :class:`LayerPlan` per layer (layers of one kind share one value);
* :class:`LayerPlan`, what one attention layer runs: its masks (``mask`` with its causal fold,
  ``query_has_key``, ``key_in_use``), ``is_causal``, a local ``window``, ``rotary`` tables,
  the packed layout, and how it runs, each choice with its reason, all made by
  :mod:`clearformer.routes`: the attention ``kernel``, the varlen ``method`` on packed rows,
  the AVX-512 kernel or PyTorch's on padded ones (``padded_route``), the ``linear`` layers
  (eager, or a fused route of :mod:`clearformer.fast`) and their epilogue kernel. A lone
  attention module or block is planned as one :class:`LayerPlan`.

``print(plan)`` shows how the call runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .options import KERNEL_NAMES, LAYOUTS, Decision
from .padding import PackedLayout
from .positions import sequence_positions

__all__ = ["CallPlan", "ForwardPlan", "LayerPlan", "Route"]


@dataclass(frozen=True)
class Route:
    """How a call runs: each choice and why (``print(plan)`` shows them)."""

    layout: Decision
    kernel: Decision
    method: Decision | None
    linear: Decision | None

    def __str__(self) -> str:
        lines = [f"layout: {self.layout}", f"kernel: {self.kernel}"]
        if self.method is not None:
            lines.append(f"varlen method: {self.method}")
        if self.linear is not None:
            lines.append(f"linear layers: {self.linear}")
        return "\n".join(lines)


class _Layout:
    """What a call plan and a layer plan both answer from their ``packing`` and ``linear``."""

    packing: PackedLayout | None
    linear: Decision | None

    @property
    def packed(self) -> bool:
        """The rows are packed ((N, D) real tokens, ``packing`` says where each sequence is)."""
        return self.packing is not None

    @property
    def fused_linear(self) -> bool:
        """The linear layers run fused (see ``linear``)."""
        return self.linear is not None and self.linear.choice == "fused"


@dataclass(frozen=True, eq=False)
class LayerPlan(_Layout):
    """Everything one attention layer (and the block around it) needs besides its rows.

    Attributes:
        layout: ``padded`` ((B, T, D) rows, ``mask`` applies) or ``packed`` ((N, D) rows).
        kernel: ``math``, ``sdpa`` or ``varlen``.
        method: on packed rows, how ``varlen`` attends (see clearformer.fast.varlen).
        padded_route: an ``sdpa`` layer on padded rows: ``avx512`` where clearformer's AVX-512
            kernel takes its attention (unmasked, or keys one run per sequence), else
            ``torch``; None for the other kernels.
        batch, tq, tk: the padded shape of the call (queries and keys).
        device: where the call's rows live.
        mask: padded layout: bool, broadcastable to (B, H, Tq, Tk), True = may attend, causal
            constraint folded in; None = attend everywhere.
        query_has_key: (B, H|1, Tq|1, 1) bool, whether a query row has any key; None when
            every row has one (known without looking at the device) or no mask is given.
        key_in_use: (B, H|1, Tk, 1) bool, whether any query may attend a key, for a lone layer
            whose mask leaves some key unused (its key and value are zeroed, so that a NaN
            there cannot reach a real query); None otherwise. A stack needs none: it zeroes
            padded rows once at its entry.
        key_runs: with ``padded_route`` ``avx512`` under a key-padding mask: (first real key,
            count) per sequence, (B,) each.
        packing: packed layout: where each sequence's rows are (``cu_seqlens``, offsets).
        is_causal: the kernel still has to apply the causal constraint itself (packed rows,
            or a padded call whose causal triangle was not folded into ``mask``).
        causal: the layer attends causally, whether or not the constraint is folded into
            ``mask``: a kernel that reads no mask (the flash kernel of a local layer's
            unpadded rows) applies it from here.
        need_weights: return attention probabilities (``math`` only).
        window: local attention: query i sees keys j of its sequence with |i - j| <= window;
            None = global attention.
        band_in_mask: the window is folded into ``mask`` (padded, short sequences or the
            ``math`` kernel); otherwise the kernel applies it itself: slab by slab on long
            padded rows (:mod:`clearformer.fast.local`), per sequence on packed rows.
        rotary: (cos, sin) float32 tables for rotary positions, shaped to broadcast over the
            heads of split queries and keys ((N, 1, Dh) packed, (B, 1, T, Dh) padded).
        score_bias: every score gets the stack's relative position bias, which the call hands
            to the layers with the rows (it is computed from parameters, per call).
        linear: how the linear layers run: ``fused`` (bias, activation and residual add inside
            oneDNN's matrix product, :mod:`clearformer.fast.fused_linear`) or ``eager``; None:
            eager (a plan no stack decided it for).
        avx512_linear: a fused route's products run on clearformer's AVX-512 linear kernel
            where it serves them (:func:`clearformer.fast.avx512_linear.serves`: those with an
            exact GELU or a LayerNorm epilogue, and every product of a call of at most
            ``FEW_ROWS`` rows), decided for the call's row count
            (:func:`clearformer.routes.epilogue_route`).
    """

    layout: Decision
    kernel: Decision
    method: Decision | None
    batch: int
    tq: int
    tk: int
    device: torch.device
    padded_route: Decision | None = None
    mask: Tensor | None = None
    query_has_key: Tensor | None = None
    key_in_use: Tensor | None = None
    key_runs: tuple[Tensor, Tensor] | None = None
    packing: PackedLayout | None = None
    is_causal: bool = False
    causal: bool = False
    need_weights: bool = False
    window: int | None = None
    band_in_mask: bool = False
    rotary: tuple[Tensor, Tensor] | None = None
    score_bias: bool = False
    linear: Decision | None = None
    avx512_linear: bool = False

    def __post_init__(self) -> None:
        # Decisions speak the vocabulary of clearformer.options, nothing else.
        assert self.layout.choice in LAYOUTS and self.kernel.choice in KERNEL_NAMES, self

    @property
    def route(self) -> Route:
        """How the layer runs, apart from what it means."""
        return Route(self.layout, self.kernel, self.method, self.linear)

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
        return str(self.route)


@dataclass(frozen=True, eq=False)
class CallPlan(_Layout):
    """One call of a stack: the batch, its layout, the outputs asked for, every layer's plan.

    Attributes:
        layout: ``padded`` ((B, T, D) rows) or ``packed`` ((N, D) real rows).
        kernel: the call's attention kernel (``math``, ``sdpa``, ``varlen``), every layer's.
        batch, tq: the padded shape (B, T) of the call.
        device: where the call's rows live.
        token_mask: (B, T) bool key-padding mask, True = real token; None when every position
            is real. The stack zeroes its padded output rows with it.
        packing: packed layout: where each sequence's rows are (``cu_seqlens``, offsets).
        packed_input: the caller gave packed rows and their ``cu_seqlens``: the stack returns
            packed rows too, and never sees a padded grid.
        need_weights: return every layer's attention probabilities (``math`` only).
        output_hidden_states: return every layer's hidden states.
        checkpointing: recompute each block's activations in the backward pass instead of
            keeping them (memory for time; a training call's choice). The stack applies it only
            in training mode with gradients enabled.
        score_bias: the stack computes its relative position bias (H, L, L) once for the call,
            L the padded length or the longest packed sequence, and hands it to every layer.
        linear: how the linear layers run (every layer's; see :class:`LayerPlan`).
        layers: the plan of each layer; layers of one kind (window, rotary base) share one.
        mode: (gradients enabled, training mode) when the plan was made: its routes hold for
            that mode only (an inference kernel, no dropout), so a call in another mode is
            planned again.
    """

    layout: Decision
    kernel: Decision
    batch: int
    tq: int
    device: torch.device
    token_mask: Tensor | None = None
    packing: PackedLayout | None = None
    packed_input: bool = False
    need_weights: bool = False
    output_hidden_states: bool = False
    checkpointing: bool = False
    score_bias: bool = False
    linear: Decision | None = None
    layers: tuple[LayerPlan, ...] = ()
    mode: tuple[bool, bool] | None = None

    def layer(self, index: int) -> LayerPlan:
        """The plan layer ``index`` of the stack runs."""
        return self.layers[index]

    @property
    def method(self) -> Decision | None:
        """The varlen method of the call's global layers (a local layer's may differ)."""
        plans = [p for p in self.layers if p.window is None] or list(self.layers)
        return plans[0].method if plans else None

    @property
    def route(self) -> Route:
        """How the call runs, apart from what it means."""
        return Route(self.layout, self.kernel, self.method, self.linear)

    @property
    def positions(self) -> Tensor:
        """Each row's position within its own sequence, counted over its real tokens: (N,)
        when packed, (B, T) when padded (what rotary tables are built from)."""
        return sequence_positions(self.packing, self.token_mask, self.batch, self.tq, self.device)

    def __str__(self) -> str:
        lines = [str(self.route)]
        kinds: dict[str, list[int]] = {}
        for i, plan in enumerate(self.layers):
            what = "global" if plan.window is None else f"local |i - j| <= {plan.window}"
            if plan.rotary is not None:
                what += ", rotary"
            if plan.padded_route is not None:
                # What each kind of layer's padded rows run on: the kernel line speaks for
                # the call as a whole, and a kind with rotary, a window or a mask may differ.
                what += f"; attention: {plan.padded_route}"
            kinds.setdefault(what, []).append(i)
        if len(kinds) > 1 or any(";" in what or what != "global" for what in kinds):
            for what, layers in kinds.items():
                lines.append(f"layers {layers}: {what}")
        return "\n".join(lines)


# The name a stack call's plan has always had.
ForwardPlan = CallPlan
