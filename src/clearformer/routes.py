"""How a call runs: every route choice of the forward plan, made here and nowhere else.

:mod:`clearformer.plan` says what a call means (its mask, causal flag, windows, rotary tables,
bias, the outputs asked for); this module chooses, for that meaning, the implementation that
runs it on this machine, each choice with its reason:

* the layout (padded rows with a mask, or packed rows) and the attention kernel of a stack call;
* the linear layers: the eager ``nn.Linear`` calls, or whole blocks with their residual adds and
  norms fused into the matrix products (:mod:`clearformer.fast.fused_blocks`);
* on packed rows, the varlen method (:mod:`clearformer.fast.varlen`), asking each method whether
  it serves the call (a causal mask, a local window, a score bias, the dtype, the device);
* on long padded rows of a local layer, whether attention runs slab by slab;
* whether clearformer's own kernels are taken (:func:`kernel_route`): only where a switch
  says ``on``, or where this CPU measured them faster than PyTorch's route and the verdict is
  cached (:mod:`clearformer.calibration`); each decision above names the verdict it read.

The layers never import :mod:`clearformer.fast`: they run the implementation the plan names.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch
from torch import Tensor, nn

from .fast import avx512, fused_blocks
from .fast.fused_linear import fusion_decision, packed_product, packing_serves
from .fast.local import use_banded
from .fast.varlen import VarlenCall, resolve_method
from .options import Decision
from .padding import PackedLayout

__all__ = [
    "PACK_MIN_PADDING",
    "kernel_route",
    "linear_route",
    "projection_route",
    "routes_fixed_for_call",
    "slab_by_slab",
    "stack_layout",
    "varlen_method",
    "weights_kernel",
]


def kernel_route(kernel: str) -> Decision:
    """``Decision("avx512" | "torch", reason)``: whether ``auto`` takes clearformer's
    ``kernel`` (``avx512_attention``, ``avx512_linear``) for the calls it serves, read from the
    switches (:mod:`clearformer.switches`) and this CPU's cached measurement
    (:mod:`clearformer.calibration`; none yet: PyTorch's route). The layers' call-time checks
    (:mod:`clearformer.kernels.sdpa`, :mod:`clearformer.fast.fused_linear`) read the same."""
    return avx512.route(kernel)


def _kernel_note(kernel: str) -> str:
    """What a decision's reason adds about ``kernel``: nothing on a CPU that cannot run it."""
    if avx512.support().choice != "available":
        return ""
    route = kernel_route(kernel)
    where = "clearformer's AVX-512 kernel" if route.choice == "avx512" else "PyTorch's route"
    return f"; {where} ({route.reason})"


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
        decision = Decision(
            decision.choice, decision.reason + _kernel_note("avx512_linear"), impl=fused_blocks
        )
    if fixed is not None:
        fixed[key] = decision
    return decision


def projection_route(x: Tensor, owner: nn.Module) -> Decision:
    """``packed`` (naming :func:`clearformer.fast.fused_linear.packed_product`) or ``eager``,
    and why, for an output projection ``x @ owner.weight^T`` (an ``nn.Linear`` or a tied
    embedding table): packed where the call runs under weights packed once for it (a decoding
    step inside ``generate``)."""
    refusal = packing_serves(x, owner)
    if refusal is not None:
        return Decision("eager", refusal)
    return Decision(
        "packed", "the weight reordered once for the call (oneDNN)", impl=packed_product
    )


def varlen_method(
    layout: PackedLayout,
    *,
    device: torch.device,
    dtype: torch.dtype,
    head_dim: int | None,
    is_causal: bool,
    window: int | None = None,
    bias: bool = False,
    grouped: bool = False,
) -> Decision:
    """The varlen method for one layer's packed rows, and why: the first that serves the call
    in the order of :func:`clearformer.fast.varlen.resolve_method`. ``grouped``: keys and
    values have fewer heads than the queries."""
    call = VarlenCall(
        device,
        dtype,
        head_dim,
        is_causal,
        window=window is not None,
        bias=bias,
        grad=torch.is_grad_enabled(),
        grouped=grouped,
    )
    available = avx512.support().choice == "available"
    route = kernel_route(avx512.attention_kernel(dtype)) if available else None
    return resolve_method("auto", layout, call=call, avx512_route=route)


def slab_by_slab(length: int, window: int) -> bool:
    """Whether a padded local layer of ``length`` rows runs slab by slab (no (T, T) band)."""
    return use_banded(length, window)


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
    dtype: torch.dtype = torch.float32,
) -> tuple[Decision, Decision]:
    """The layout and the attention kernel of a stack call on a (B, T) batch with this key
    mask (None: no padding) and ``backend``, each with its reason (an ``sdpa`` kernel's
    says whether unmasked rows and key runs of ``dtype`` take clearformer's AVX-512
    attention)."""
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
    else:
        padding = 1.0 - float(mask.sum()) / max(mask.numel(), 1)
        if padding >= PACK_MIN_PADDING:
            kernel = Decision("varlen", "packed rows: only varlen attention reads cu_seqlens")
            layout = Decision("packed", f"{padding:.0%} of positions are padding")
        else:
            kernel = Decision("sdpa", "fused kernel, padded layout")
            layout = Decision("padded", f"only {padding:.0%} padding: packing would not pay")
    if kernel.choice == "sdpa" and not compiling:
        kernel = Decision("sdpa", kernel.reason + _kernel_note(avx512.attention_kernel(dtype)))
    return layout, kernel
