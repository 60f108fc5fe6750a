"""How a call runs: every route choice of the forward plan, made here and nowhere else.

:mod:`clearformer.plan` says what a call means (its mask, causal flag, windows, rotary tables,
the outputs asked for) and asks this module, once per call, which implementation runs it on
this machine. Each answer is a :class:`~clearformer.options.Decision` with its reason:

* the layout (padded rows with a mask, or packed rows) and the attention kernel of a stack
  call (:func:`stack_layout`), the text applications' rule that a text's result must not
  depend on its batch-mates included;
* per layer kind, how attention runs: on packed rows the varlen method (:func:`varlen_method`,
  asking each method whether it serves the call: a causal mask, a window, a bias, grouped
  keys, the dtype, the device), on padded rows whether clearformer's AVX-512 kernel takes the
  unmasked or key-run calls (:func:`padded_attention_route`), whether a long local layer
  runs slab by slab (:func:`slab_by_slab`);
* the linear layers: eager, or whole blocks with their residual adds and norms fused into the
  matrix products (:func:`linear_route`), and whether the products with an exact GELU or a
  LayerNorm epilogue take the AVX-512 linear kernel (:func:`epilogue_route`);
* an output projection on weights reordered for the call (:func:`projection_route`).

Two parts live in modules of their own and are re-exported here, so that every route is asked
by one name: whether ``auto`` takes one of clearformer's AVX-512 kernels
(:mod:`clearformer.kernel_routes`) and how each layer kind's attention runs
(:mod:`clearformer.attention_routes`). These three modules are the only readers of the
switches (:mod:`clearformer.switches`), of the measured verdicts
(:mod:`clearformer.calibration`) and of the machine's capabilities
(:func:`clearformer.machine.machine`). The layers and kernels run what the plan names and never
decide (``tests/test_plan_ran.py`` holds them to it).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch
from torch import Tensor, nn

from .attention_routes import (
    MAX_SEQUENCE_CALLS,
    VarlenCall,
    attention_kernel_for,
    avx512_refusal,
    avx512_serves,
    flash_bf16_serves,
    flash_kernel_serves,
    flash_serves,
    padded_attention_route,
    sdpa_note,
    slab_by_slab,
    varlen_method,
)
from .fast import fused_blocks
from .fast.avx512_linear import FEW_ROWS
from .fast.fused_linear import has_hooks, has_inner_hooks, reordered_product
from .fast.reordered_weights import active_reordering
from .kernel_routes import (
    dropout_masks_route,
    kernel_note,
    kernel_route,
    kernels_wanted,
    verdicts_wanted,
)
from .machine import machine
from .options import Decision
from .tracing import is_recording

__all__ = [
    "MAX_SEQUENCE_CALLS",
    "PACK_MIN_PADDING",
    "VarlenCall",
    "attention_kernel_for",
    "avx512_refusal",
    "avx512_serves",
    "dropout_masks_route",
    "epilogue_route",
    "flash_bf16_serves",
    "flash_kernel_serves",
    "flash_serves",
    "kernel_route",
    "kernels_wanted",
    "linear_route",
    "padded_attention_route",
    "projection_route",
    "routes_fixed_for_call",
    "sdpa_note",
    "slab_by_slab",
    "stack_layout",
    "varlen_method",
    "verdicts_wanted",
    "weights_kernel",
]

# -- the layout and the kernel of a stack call -------------------------------------------------

# Packing costs one gather and one scatter of (N, D), and attention then needs one call per run
# of equally long sequences or a gather to a padded copy: below this fraction of padding the
# padded layout is as fast (measured break-even between 5 and 8.5 %, docs/performance.md).
PACK_MIN_PADDING = 0.06


def weights_kernel(backend: str) -> Decision:
    """The kernel of a call that asks for attention weights: only ``math`` returns them."""
    if backend in ("auto", "math"):
        return Decision("math", "attention weights requested; only the math kernel returns them")
    raise ValueError(
        f"attention weights requested (need_weights / output_attentions): the {backend!r} "
        "backend cannot return attention weights; use backend='math' (or 'auto', which picks "
        "'math' when weights are requested)"
    )


def stack_layout(
    mask: Tensor | None,
    backend: str,
    *,
    need_weights: bool,
    compiling: bool,
    rows_alone: bool = False,
) -> tuple[Decision, Decision]:
    """The layout and the attention kernel of a stack call on a (B, T) batch with this key
    mask (None: no padding) and ``backend``, each with its reason.

    ``rows_alone``: each row's result must not depend on the rows beside it (the text
    applications' rule). ``auto`` runs a batch with little padding on the padded layout, where
    attention spans the batch's padded length with a mask; that rounds otherwise than the same
    text attending alone (1e-7 apart). So under this rule a batch with any padding is packed,
    and a batch without padding keeps the padded layout, where each text attends to itself."""
    if need_weights:
        kernel = weights_kernel(backend)
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
    elif rows_alone:
        kernel = Decision("varlen", "packed rows: only varlen attention reads cu_seqlens")
        layout = Decision("packed", "each row's result must not depend on its batch-mates")
    else:
        padding = 1.0 - float(mask.sum()) / max(mask.numel(), 1)
        if padding >= PACK_MIN_PADDING:
            kernel = Decision("varlen", "packed rows: only varlen attention reads cu_seqlens")
            layout = Decision("packed", f"{padding:.0%} of positions are padding")
        else:
            kernel = Decision("sdpa", "fused kernel, padded layout")
            layout = Decision("padded", f"only {padding:.0%} padding: packing would not pay")
    return layout, kernel


def packed_rows_kernel(backend: str, need_weights: bool, *, lone: bool = False) -> Decision:
    """The kernel of rows the caller packed already (a stack's ``cu_seqlens``, or a ``lone``
    layer's layout): ``math`` by name, else ``varlen``."""
    if need_weights and lone:
        raise ValueError(
            "need_weights=True on packed rows: weights need the padded layout and the "
            "'math' backend; run the stack with backend='math'"
        )
    if need_weights:
        raise ValueError(
            "output_attentions=True on packed rows: attention weights are (B, H, T, T) on the "
            "padded layout; pass (B, T) ids with a mask and backend='math'"
        )
    if backend == "sdpa":
        given = "a layout" if lone else "cu_seqlens"
        raise ValueError(
            f"backend='sdpa' runs on the padded layout, got packed rows ({given}); use "
            "backend='auto' or 'varlen' (fused), or 'math' (the reference formula)"
        )
    if backend == "math":
        return Decision("math", "requested by name: reference formula per sequence")
    return Decision("varlen", "packed rows: only varlen attention reads cu_seqlens")


def lone_layer_kernel(backend: str, need_weights: bool) -> Decision:
    """The kernel of a lone layer's call on padded rows."""
    if need_weights:
        return weights_kernel(backend)
    if backend == "varlen":
        raise ValueError(
            "backend='varlen' runs on packed rows: pass (N, in_dim) rows with a layout from "
            "clearformer.padding.unpad, or use Encoder, which packs at the stack's edge; "
            "for a padded (B, T, D) batch use backend='sdpa' or 'auto'"
        )
    if backend == "auto":
        return Decision("sdpa", "fused kernel, no weights requested, padded layout")
    return Decision(backend, "requested by name")


# -- linear layers -----------------------------------------------------------------------------

# The linear routes of the passes inside routes_fixed_for_call, by (device, dtype, training,
# module): a context variable, so that each thread sees only the block it entered.
_fixed: contextvars.ContextVar[dict | None] = contextvars.ContextVar(
    "clearformer_fixed_routes", default=None
)


@contextlib.contextmanager
def routes_fixed_for_call() -> Iterator[None]:
    """Within the block, :func:`linear_route` decides once per module, device, dtype and mode:
    a call that makes many forward passes of one model (``generate``'s steps) pays the decision,
    and its walk over every module for hooks, once. Hooks added inside the block are seen from
    the next call on."""
    token = _fixed.set({})
    try:
        yield
    finally:
        _fixed.reset(token)


def fusion_decision(
    device: torch.device, dtype: torch.dtype, training: bool, module: nn.Module | None = None
) -> Decision:
    """Whether a call on ``device`` in ``dtype`` by a module in ``training`` mode may run its
    linear layers fused, and why (``Decision("fused" | "eager", reason)``). ``module``: the
    stack making the call; forward hooks on any module inside it keep the eager layers."""
    if device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16):
        return Decision("eager", "fused linear layers serve float32 and bfloat16 on CPU only")
    if training or torch.is_grad_enabled():
        return Decision("eager", "gradients (or dropout) need the eager layers")
    if torch.is_autocast_enabled("cpu"):
        return Decision("eager", "autocast computes in its own dtype")
    if is_recording():
        return Decision("eager", "a trace records every eager step")
    if torch.compiler.is_compiling():
        return Decision("eager", "under torch.compile the compiler fuses")
    if torch.jit.is_tracing():
        return Decision("eager", "a TorchScript trace records the eager layers")
    if module is not None and has_inner_hooks(module):
        return Decision("eager", "forward hooks inside the model see the eager layers")
    if not machine().onednn:
        return Decision("eager", "this PyTorch build has no oneDNN fused linear op")
    if dtype == torch.bfloat16:
        if not machine().onednn_bf16:
            return Decision("eager", "oneDNN's fused linear op does not run bfloat16 here")
        return Decision(
            "fused", "CPU inference in bfloat16: bias, activation and residual fused (oneDNN)"
        )
    return Decision("fused", "CPU inference: bias, activation and residual fused (oneDNN)")


def linear_route(
    device: torch.device, dtype: torch.dtype, training: bool, module: nn.Module | None
) -> Decision:
    """``fused`` (naming :mod:`clearformer.fast.fused_blocks`) or ``eager``, and why, for a call
    of ``module`` on rows on ``device`` in ``dtype``; a fused route's reason says whether the
    GELU and LayerNorm epilogues take clearformer's AVX-512 linear kernel."""
    # A graph being compiled or exported decides as it traces (dynamo cannot read the context).
    fixed = None if torch.compiler.is_compiling() else _fixed.get()
    key = (device, dtype, training, id(module))
    if fixed is not None and key in fixed:
        return fixed[key]
    decision = fusion_decision(device, dtype, training, module)
    if decision.choice == "fused":
        # Both of the linear kernel's verdicts: a batch's rows, and a sentence's few rows.
        notes = kernel_note("avx512_linear") + kernel_note("avx512_linear_rows")
        decision = Decision(decision.choice, decision.reason + notes, impl=fused_blocks)
    if fixed is not None:
        fixed[key] = decision
    return decision


def epilogue_route(linear: Decision | None, dtype: torch.dtype, rows: int) -> bool:
    """Whether a fused route's products with an exact GELU or a LayerNorm epilogue take
    clearformer's AVX-512 linear kernel (float32 rows, where ``auto`` takes it): for a call of
    at most :data:`~clearformer.fast.avx512_linear.FEW_ROWS` ``rows`` (a sentence alone), on
    the verdict of its few-rows order (``avx512_linear_rows``), else on the kernel's own; the
    kernel itself still declines shapes it cannot tile
    (:func:`clearformer.fast.avx512_linear.serves`)."""
    few = 0 < rows <= FEW_ROWS
    return (
        linear is not None
        and linear.choice == "fused"
        and dtype == torch.float32
        and machine().avx512_available
        and kernel_route("avx512_linear_rows" if few else "avx512_linear").choice == "avx512"
    )


def projection_route(x: Tensor, owner: nn.Module) -> Decision:
    """``reordered`` (naming :func:`clearformer.fast.fused_linear.reordered_product`) or ``eager``,
    and why, for an output projection ``x @ owner.weight^T`` (an ``nn.Linear`` or a tied
    embedding table): packed where the call runs under weights reordered once for it (a decoding
    step inside ``generate``)."""
    copies = active_reordering()
    weight = owner.weight
    if copies is None:
        return Decision("eager", "no reordered weights for this call (only generate packs them)")
    if x.numel() == 0 or x.dtype != weight.dtype or not copies.has_own_copy(owner):
        return Decision(
            "eager",
            "rows and weight must be non-empty float32 or bfloat16 CPU tensors of one dtype",
        )
    if weight.dtype not in machine().reorder:
        return Decision("eager", "this PyTorch build cannot reorder the weight for oneDNN")
    if has_hooks(owner):
        return Decision("eager", "forward hooks on the projection see the eager layer")
    decision = fusion_decision(x.device, x.dtype, owner.training)
    if decision.choice != "fused":
        return Decision("eager", decision.reason)
    return Decision(
        "reordered", "the weight reordered once for the call (oneDNN)", impl=reordered_product
    )
