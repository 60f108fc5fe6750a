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

It is the only reader of the switches (:mod:`clearformer.switches`), of the measured verdicts
(:mod:`clearformer.calibration`) and of the machine's capabilities
(:func:`clearformer.machine.machine`). The layers and kernels run what the plan names and never
decide (``tests/test_plan_ran.py`` holds them to it).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from . import switches
from .calibration.cache import cached_verdicts, shown
from .checks import check_choice
from .fast import avx512, fused_blocks
from .fast.fused_linear import has_hooks, has_inner_hooks, reordered_product
from .fast.local import use_banded
from .fast.reordered_weights import active_reordering
from .machine import machine
from .options import VARLEN_METHODS, Decision
from .padding import PackedLayout
from .runtime import capturing_graph
from .tracing import is_recording

__all__ = [
    "MAX_SEQUENCE_CALLS",
    "PACK_MIN_PADDING",
    "VarlenCall",
    "avx512_serves",
    "epilogue_route",
    "flash_serves",
    "kernel_route",
    "kernels_wanted",
    "linear_route",
    "padded_attention_route",
    "projection_route",
    "routes_fixed_for_call",
    "slab_by_slab",
    "stack_layout",
    "varlen_method",
    "weights_kernel",
]

# -- clearformer's own kernels: switches, then this CPU's measured verdict ---------------------

_LABELS = {
    "avx512_attention": "AVX-512 attention",
    "avx512_attention_bf16": "AVX-512 attention on bfloat16 rows",
    "avx512_linear": "AVX-512 linear",
}


def kernel_route(kernel: str) -> Decision:
    """``Decision("avx512" | "torch", reason)``: whether ``auto`` takes clearformer's
    ``kernel`` (one of :data:`clearformer.fast.avx512.KERNELS`) for the calls it serves.

    Off where a switch says so or the library is not built (a built one is loaded here;
    nothing is compiled). ``CLEARFORMER_AVX512=on`` takes it unmeasured. Otherwise (``auto``)
    it is taken only where this CPU measured it decisively faster than PyTorch's route, as the
    cached verdict says (:mod:`clearformer.calibration`); with no verdict yet, PyTorch's
    route is kept."""
    if kernel not in avx512.KERNELS:
        raise ValueError(f"kernel: expected one of {avx512.KERNELS}, got {kernel!r}")
    setting = switches.kernel_setting(kernel)
    if setting.choice == "off":
        return Decision("torch", setting.reason)
    supported = machine().avx512
    if supported.choice != "available":
        return Decision("torch", supported.reason)
    label = _LABELS[kernel]
    if setting.choice == "on":
        taken = Decision("avx512", f"{label}: {setting.reason}, taken unmeasured")
    elif not switches.calibration_enabled():
        return Decision(
            "torch", f"{label}: {switches.CALIBRATION_VARIABLE}=off, PyTorch's route kept"
        )
    else:
        key = avx512.calibration_key()
        verdicts, path = cached_verdicts(key)
        verdict = None if verdicts is None else verdicts.get(kernel)
        if verdict is None:
            return Decision(
                "torch",
                f"{label}: not measured on this CPU yet, PyTorch's route kept; "
                "`clearformer calibrate` measures it",
            )
        measured = f"{label}: {verdict.reason} on {key.cpu}, cached {shown(path)}"
        if verdict.winner != "avx512":
            return Decision("torch", measured)
        taken = Decision("avx512", measured)
    if not avx512.is_loaded():  # a library built earlier is loaded here; nothing is compiled
        loaded = avx512.load(build=False)
        if loaded.choice != "loaded":
            return Decision("torch", f"{label}: the library is {loaded.choice}: {loaded.reason}")
    return taken


def kernels_wanted(kernels: tuple[str, ...] = avx512.KERNELS) -> bool:
    """Whether clearformer's AVX-512 library (or one of ``kernels``) may be built and taken
    here: a CPU that can build it, with not every one of ``kernels`` switched off. Whether
    ``auto`` takes a kernel is :func:`kernel_route`'s answer."""
    if all(switches.kernel_setting(kernel).choice == "off" for kernel in kernels):
        return False
    return machine().avx512_available


def verdicts_wanted() -> bool:
    """Calibration on, a kernel left to ``auto``, and this CPU and build without a verdict for
    every kernel: a measurement would change what ``auto`` takes."""
    if not switches.calibration_enabled():
        return False
    settings = {switches.kernel_setting(kernel).choice for kernel in avx512.KERNELS}
    if "auto" not in settings:
        return False
    verdicts, _ = cached_verdicts(avx512.calibration_key())
    return verdicts is None or not set(avx512.KERNELS) <= set(verdicts)


def _kernel_note(kernel: str) -> str:
    """What a decision's reason adds about ``kernel``: nothing on a CPU that cannot run it."""
    if not machine().avx512_available:
        return ""
    route = kernel_route(kernel)
    where = "clearformer's AVX-512 kernel" if route.choice == "avx512" else "PyTorch's route"
    return f"; {where} ({route.reason})"


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


# -- attention per layer kind ------------------------------------------------------------------


@dataclass(frozen=True)
class VarlenCall:
    """What one layer's attention asks of an implementation: the facts each serves or not.

    Attributes:
        device, dtype: where the rows are and their dtype.
        head_dim: the heads' width (None: not known, not checked).
        is_causal: token i sees tokens j <= i of its sequence.
        window: a local window applies.
        bias: an additive score bias applies (a relative position bias).
        dropout: dropout on the attention probabilities.
        grad: gradients flow through the call.
        grouped: keys and values have fewer heads than the queries (grouped-query attention).
        rows_apart: queries and keys reach attention as new tensors (rotated by rotary
            positions, or normed per head) while the values stay views of the projection's
            rows: their strides differ.
    """

    device: torch.device
    dtype: torch.dtype = torch.float32
    head_dim: int | None = None
    is_causal: bool = False
    window: bool = False
    bias: bool = False
    dropout: bool = False
    grad: bool = False
    grouped: bool = False
    rows_apart: bool = False


# Above this many attention calls per layer, ``auto`` takes ``padded`` over ``sequence``.
MAX_SEQUENCE_CALLS = 8


def flash_serves(call: VarlenCall) -> Decision:
    """``serves`` or ``declines`` the call, and why (``flash_attn_varlen_func``: CUDA half
    precision, heads at most 256 wide in multiples of 8)."""
    if call.window or call.bias:
        # flash_attn's own window is not wired in, and it takes no additive bias.
        return Decision("declines", "flash_attn takes no window or bias here")
    if not (
        call.device.type == "cuda"
        and call.dtype in (torch.float16, torch.bfloat16)
        and (call.head_dim is None or (call.head_dim <= 256 and call.head_dim % 8 == 0))
        and machine().flash_attn
    ):
        return Decision("declines", "needs CUDA half precision and the flash_attn package")
    return Decision("serves", "CUDA half precision with flash_attn installed")


def avx512_serves(call: VarlenCall) -> Decision:
    """``serves`` or ``declines`` the call, and why (clearformer's AVX-512 kernel: float32 or
    bfloat16 CPU rows, heads a multiple of 16 wide, plain bidirectional attention without
    gradients, one key/value head per query head)."""
    if call.window or call.bias or call.is_causal or call.dropout:
        return Decision("declines", "the AVX-512 kernel takes no window, bias, causal or dropout")
    if call.grad:
        return Decision("declines", "the AVX-512 kernel has no backward")
    if call.grouped:
        return Decision("declines", "the AVX-512 kernel reads one key/value head per query head")
    if call.rows_apart:
        return Decision(
            "declines",
            "the AVX-512 kernel reads q, k, v of one layout; rotary or q/k norms "
            "make new queries and keys",
        )
    if not (
        call.device.type == "cpu"
        and call.dtype in (torch.float32, torch.bfloat16)
        and (call.head_dim is None or call.head_dim % 16 == 0)
    ):
        return Decision(
            "declines", "the AVX-512 kernel needs float32 or bfloat16 CPU rows, heads of 16k"
        )
    return Decision("serves", "clearformer's AVX-512 kernel (built, on an AVX-512 CPU)")


def varlen_method(
    layout: PackedLayout, call: VarlenCall, method: str = "auto", *, avx512_taken=None
) -> Decision:
    """The varlen method one layer's packed rows run on, and why.

    ``auto`` takes the first method that serves the call: ``flash``, then ``avx512`` where
    :func:`kernel_route` takes it (``avx512_taken``: that decision, given by a caller that
    measures both sides), then among PyTorch's kernels: ``sequence`` for a single-threaded
    caller or a single run, ``threads`` for several runs on a CPU (no parallel region to wait
    in when other processes take the cores), ``sequence`` up to ``MAX_SEQUENCE_CALLS`` calls
    elsewhere and ``padded`` above. A method named explicitly that cannot serve raises."""
    check_choice(method, VARLEN_METHODS, "method")
    if method == "auto":
        flash = flash_serves(call)
        if flash.choice == "serves":
            return Decision("flash", flash.reason)
        not_taken = ""
        if call.device.type == "cpu" and machine().avx512_available:
            served = _avx512_serves_now(call)
            if served.choice == "serves":
                taken = avx512_taken or kernel_route(avx512.attention_kernel(call.dtype))
                if taken.choice == "avx512":
                    return Decision("avx512", taken.reason)
                not_taken = f"; not avx512: {taken.reason}"
            else:
                # The kernel is there but cannot take this call: the method taken says so.
                not_taken = f"; avx512 declines: {served.reason}"
        fallback = _pytorch_method(layout, call)
        return Decision(fallback.choice, fallback.reason + not_taken)
    if method == "avx512":
        refusal = avx512_refusal()
        if refusal is not None:
            raise ValueError(f"method='avx512' cannot run here: {refusal}")
        served = avx512_serves(call)
        if served.choice != "serves":
            raise ValueError(
                f"method='avx512' cannot serve this call ({served.reason}): device="
                f"{call.device}, dtype={call.dtype}, head_dim={call.head_dim}"
            )
    if method == "flash" and flash_serves(call).choice != "serves":
        raise ValueError(
            "method='flash' needs CUDA tensors in float16/bfloat16, heads at most 256 wide in "
            f"multiples of 8 and the flash_attn package, and no window or bias, got "
            f"device={call.device}, dtype={call.dtype}, head_dim={call.head_dim}"
        )
    if method == "threads" and call.dropout:
        # Dropout draws from one generator in an order that would depend on thread timing.
        return Decision("sequence", "requested 'threads'; dropout keeps one thread's order")
    return Decision(method, "requested by name")


def _avx512_serves_now(call: VarlenCall) -> Decision:
    """:func:`avx512_serves`, and no graph being captured: a compiler, exporter or tracer
    records PyTorch's own ops (the kernel's op has no shape function)."""
    served = avx512_serves(call)
    if served.choice == "serves" and capturing_graph():
        return Decision("declines", "a graph capture records PyTorch's own kernels")
    return served


def avx512_refusal() -> str | None:
    """Why the AVX-512 kernel, named explicitly, cannot run in this process (every kernel
    switched off, or the library cannot be built or loaded; it is built here if need be), or
    None."""
    off = switches.all_off()
    if off is not None:
        return off.reason
    loaded = avx512.load(build=True)
    return None if loaded.choice == "loaded" else loaded.reason


def _pytorch_method(layout: PackedLayout, call: VarlenCall) -> Decision:
    """What ``auto`` takes among PyTorch's kernels (``threads``, ``sequence``, ``padded``)."""
    calls = len(layout.runs)
    if call.device.type == "cpu":
        if torch.get_num_threads() == 1:
            # No parallel region, nothing to wait for: one call per run is the fastest.
            return Decision("sequence", "a single-threaded caller: one call per run")
        if calls > 1 and not call.dropout:
            # No OpenMP region to wait in when other processes take the cores; slower
            # than `sequence` on free cores (docs/performance.md).
            return Decision(
                "threads", f"{calls} runs grouped over {torch.get_num_threads()} threads"
            )
    if calls <= MAX_SEQUENCE_CALLS:
        return Decision("sequence", f"{calls} call(s) of fused attention per layer")
    return Decision(
        "padded", f"{calls} runs of equal lengths > {MAX_SEQUENCE_CALLS}: one padded call"
    )


def padded_attention_route(
    call: VarlenCall, *, square: bool, unmasked: bool, key_runs: bool
) -> Decision:
    """``avx512`` or ``torch``: whether a padded ``sdpa`` layer's attention takes clearformer's
    AVX-512 kernel. It serves self-attention (``square``) with no mask (``unmasked``) or under
    a key-padding mask whose real keys are one run per sequence, every sequence with a key
    (``key_runs``), where ``auto`` takes the kernel for the rows' dtype; the rest stays with
    PyTorch's fused kernel."""
    if capturing_graph():
        return Decision("torch", "a graph capture records PyTorch's own kernels")
    if call.device.type != "cpu" or not machine().avx512_available:
        return Decision("torch", "PyTorch's fused kernel")
    served = avx512_serves(call)
    if served.choice != "serves":
        return Decision("torch", served.reason)
    if not square or not (unmasked or key_runs):
        return Decision("torch", "the AVX-512 kernel takes unmasked or key-run self-attention")
    taken = kernel_route(avx512.attention_kernel(call.dtype))
    return Decision("avx512" if taken.choice == "avx512" else "torch", taken.reason)


def sdpa_note(call: VarlenCall) -> str:
    """What an ``sdpa`` kernel's printed reason adds: whether unmasked rows and key runs of
    the call's dtype take clearformer's AVX-512 attention."""
    return _kernel_note(avx512.attention_kernel(call.dtype))


def slab_by_slab(length: int, window: int) -> bool:
    """Whether a padded local layer of ``length`` rows runs slab by slab (no (T, T) band)."""
    return use_banded(length, window)


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
        decision = Decision(
            decision.choice, decision.reason + _kernel_note("avx512_linear"), impl=fused_blocks
        )
    if fixed is not None:
        fixed[key] = decision
    return decision


def epilogue_route(linear: Decision | None, dtype: torch.dtype) -> bool:
    """Whether a fused route's products with an exact GELU or a LayerNorm epilogue take
    clearformer's AVX-512 linear kernel (float32 rows, where ``auto`` takes it); the kernel
    itself still declines shapes it cannot tile (:func:`clearformer.fast.avx512_linear.serves`)."""
    return (
        linear is not None
        and linear.choice == "fused"
        and dtype == torch.float32
        and machine().avx512_available
        and kernel_route("avx512_linear").choice == "avx512"
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
