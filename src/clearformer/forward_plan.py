"""The forward plan: one call's meaning and its route, as one frozen value.

A plan is made per call at the stack's edge (:mod:`clearformer.plan`) and read by every layer;
it is never state on a module. Its fields fall in two groups:

* **what the call means**, read by every implementation alike: the shape and device, the masks
  (``token_mask``, ``mask`` with its causal fold, ``query_has_key``, ``key_in_use``),
  ``is_causal``, a local ``window``, ``rotary`` tables, a ``score_bias``, the packed layout's
  rows (``packing``) and the outputs asked for (``need_weights``, ``output_hidden_states``,
  ``checkpointing``);
* **how it runs** (:attr:`ForwardPlan.route`), each choice with its reason, all made by
  :mod:`clearformer.routes`: the ``layout``, the attention ``kernel``, the varlen ``method``
  and the ``linear`` layers (eager, or a fused route of :mod:`clearformer.fast`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .options import KERNEL_NAMES, LAYOUTS, Decision
from .padding import PackedLayout

__all__ = ["ForwardPlan", "Route", "padded_positions", "positions_of"]


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


@dataclass(frozen=True, eq=False)
class ForwardPlan:
    """Everything the layers of one call need to know besides their input rows.

    Attributes:
        layout: ``padded`` ((B, T, D) rows, ``mask`` applies) or ``packed`` ((N, D) rows).
        kernel: ``math``, ``sdpa`` or ``varlen``.
        method: on packed rows, how ``varlen`` attends (see clearformer.fast.varlen).
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
            padded rows (:mod:`clearformer.fast.local`), per sequence on packed rows.
        rotary: (cos, sin) float32 tables for rotary positions, shaped to broadcast over the
            heads of split queries and keys ((N, 1, Dh) packed, (B, 1, T, Dh) padded).
        score_bias: (H, L, L) float added to every layer's scores (a relative position bias,
            :mod:`clearformer.relative_bias`), L the padded length or the longest packed
            sequence; a sequence of length l starting at position 0 reads its top-left
            (H, l, l) corner. Attached by the stack that owns the bias; None: no bias.
        packed_input: the caller gave packed rows and their ``cu_seqlens``: the stack returns
            packed rows too, and never sees a padded grid.
        linear: how the linear layers run: ``fused`` (bias, activation and residual add inside
            oneDNN's matrix product, :mod:`clearformer.fast.fused_linear`: CPU inference in
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
    def route(self) -> Route:
        """How the call runs, apart from what it means."""
        return Route(self.layout, self.kernel, self.method, self.linear)

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
        lines = [str(self.route)]
        kinds: dict[str, list[int]] = {}
        for i, plan in enumerate(self.per_layer):
            what = "global" if plan.window is None else f"local |i - j| <= {plan.window}"
            if plan.rotary is not None:
                what += ", rotary"
            kinds.setdefault(what, []).append(i)
        for what, layers in kinds.items():
            lines.append(f"layers {layers}: {what}")
        return "\n".join(lines)


def positions_of(plan: ForwardPlan) -> Tensor:
    """Each row's position within its own sequence: (N,) packed, (B, T) padded.

    Counted over real tokens only, so that a padded row and the same row packed get the same
    position (with right padding, as tokenizers pad, that is simply 0, 1, 2, ...).
    """
    if plan.packing is not None:
        return plan.packing.positions
    if plan.token_mask is None:
        return torch.arange(plan.tq, device=plan.device)[None].expand(plan.batch, plan.tq)
    return padded_positions(plan.token_mask)


def padded_positions(token_mask: Tensor) -> Tensor:
    """(B, T) bool mask, True = real token -> (B, T) int64: each token's index among its row's
    real tokens (a padded position takes its real neighbour's; its row is zeroed anyway)."""
    return (token_mask.cumsum(dim=1) - 1).clamp(min=0)  # (B, T)
