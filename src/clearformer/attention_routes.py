"""How one layer kind's attention runs, and why: on packed rows the varlen method
(:func:`varlen_method`, asking each method whether it serves the call), on padded rows whether
clearformer's AVX-512 kernel takes the call (:func:`padded_attention_route`), and whether a
long local layer runs slab by slab (:func:`slab_by_slab`). Part of the routes
(:mod:`clearformer.routes` re-exports every name here); :mod:`clearformer.plan` asks them once
per call.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import switches
from .checks import check_choice
from .fast import avx512
from .fast.local import use_banded
from .kernel_routes import kernel_note, kernel_route
from .machine import machine
from .options import VARLEN_METHODS, Decision
from .padding import PackedLayout
from .runtime import capturing_graph

__all__ = [
    "MAX_SEQUENCE_CALLS",
    "VarlenCall",
    "attention_kernel_for",
    "avx512_refusal",
    "avx512_serves",
    "flash_bf16_serves",
    "flash_kernel_serves",
    "flash_serves",
    "padded_attention_route",
    "sdpa_note",
    "slab_by_slab",
    "varlen_method",
]


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
        value_dim: the values' head width where it differs from ``head_dim`` (None: the
            same); clearformer's kernels read values as wide as queries and keys.
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
    value_dim: int | None = None


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
    if _values_wider(call):
        return Decision("declines", "the AVX-512 kernel reads values as wide as the keys")
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


def flash_kernel_serves(call: VarlenCall) -> Decision:
    """``serves`` or ``declines`` the call, and why (clearformer's flash kernels: float32 CPU
    rows, or bfloat16 ones on an AVX512-BF16 CPU; heads a multiple of 32 wide, causal or
    bidirectional, local or global, grouped keys and values, no bias, dropout or
    gradients)."""
    multiple = avx512.FLASH_HEAD_MULTIPLE
    if not (
        call.device.type == "cpu"
        and call.dtype in (torch.float32, torch.bfloat16)
        and (call.head_dim is None or call.head_dim % multiple == 0)
    ):
        return Decision(
            "declines",
            f"the flash kernels need float32 or bfloat16 CPU rows, heads of {multiple}k",
        )
    name = "bfloat16" if call.dtype == torch.bfloat16 else "float32"
    if call.bias or call.dropout:
        return Decision("declines", f"the {name} flash kernel takes no bias or dropout")
    if call.grad:
        return Decision("declines", f"the {name} flash kernel has no backward")
    if _values_wider(call):
        return Decision("declines", f"the {name} flash kernel reads values as wide as the keys")
    if call.dtype == torch.bfloat16 and not avx512.bf16_products():
        return Decision("declines", "the bfloat16 flash kernel needs a CPU with AVX512-BF16")
    if call.dtype == torch.bfloat16:
        return Decision("serves", "clearformer's bfloat16 flash kernel (AVX512-BF16)")
    return Decision("serves", "clearformer's float32 flash kernel (AVX-512)")


def flash_bf16_serves(call: VarlenCall) -> Decision:
    """:func:`flash_kernel_serves` for bfloat16 rows: declines any other dtype."""
    if call.dtype != torch.bfloat16:
        return Decision(
            "declines",
            f"the bfloat16 flash kernel needs bfloat16 CPU rows, heads of "
            f"{avx512.FLASH_HEAD_MULTIPLE}k",
        )
    return flash_kernel_serves(call)


def _values_wider(call: VarlenCall) -> bool:
    """The values' heads differ in width from the queries' and keys' (a lone module's v_dim)."""
    return call.value_dim is not None and call.value_dim != call.head_dim


def attention_kernel_for(call: VarlenCall) -> tuple[str, Decision]:
    """Which of clearformer's attention kernels would take the call (its name in
    :data:`clearformer.fast.avx512.KERNELS`, whose verdict ``auto`` reads) and whether it
    serves it: rows the AVX-512 kernel cannot read as they are (causal, local, grouped keys
    and values, queries and keys made apart from the values) go to the flash kernel of their
    dtype, every other call to the AVX-512 kernel."""
    if call.is_causal or call.grouped or call.rows_apart or call.window:
        return avx512.flash_kernel(call.dtype), flash_kernel_serves(call)
    return avx512.attention_kernel(call.dtype), avx512_serves(call)


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
            kernel, served = _avx512_serves_now(call)
            if served.choice == "serves":
                taken = avx512_taken or kernel_route(kernel)
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
        _, served = attention_kernel_for(call)
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


def _avx512_serves_now(call: VarlenCall) -> tuple[str, Decision]:
    """:func:`attention_kernel_for`, and no graph being captured: a compiler, exporter or
    tracer records PyTorch's own ops (the kernels' ops have no shape function)."""
    kernel, served = attention_kernel_for(call)
    if served.choice == "serves" and capturing_graph():
        return kernel, Decision("declines", "a graph capture records PyTorch's own kernels")
    return kernel, served


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
    (``key_runs``), where ``auto`` takes the kernel for the call (:func:`attention_kernel_for`;
    the flash kernels, unmasked rows only); the rest stays with PyTorch's fused kernel."""
    if capturing_graph():
        return Decision("torch", "a graph capture records PyTorch's own kernels")
    if call.device.type != "cpu" or not machine().avx512_available:
        return Decision("torch", "PyTorch's fused kernel")
    kernel, served = attention_kernel_for(call)
    if served.choice != "serves":
        return Decision("torch", served.reason)
    if not square or not (unmasked or key_runs):
        return Decision("torch", "the AVX-512 kernel takes unmasked or key-run self-attention")
    if kernel in (avx512.FLASH, avx512.FLASH_BF16) and not unmasked:
        return Decision("torch", "the flash kernels take unmasked padded rows only")
    taken = kernel_route(kernel)
    return Decision("avx512" if taken.choice == "avx512" else "torch", taken.reason)


def sdpa_note(call: VarlenCall) -> str:
    """What an ``sdpa`` kernel's printed reason adds: whether unmasked rows and key runs of
    the call's dtype take clearformer's AVX-512 attention."""
    return kernel_note(attention_kernel_for(call)[0])


def slab_by_slab(length: int, window: int) -> bool:
    """Whether a padded local layer of ``length`` rows runs slab by slab (no (T, T) band)."""
    return use_banded(length, window)
