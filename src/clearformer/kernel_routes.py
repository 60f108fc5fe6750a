"""Whether ``auto`` takes one of clearformer's own AVX-512 kernels on this machine: the switches
first, then this CPU's measured verdict (:mod:`clearformer.calibration`). Part of the routes
(:mod:`clearformer.routes`, which re-exports every name here): with the attention routes
(:mod:`clearformer.attention_routes`), the only readers of the switches, the verdicts and the
machine's capabilities.
"""

from __future__ import annotations

from . import switches
from .calibration.cache import cached_verdicts, settled, shown
from .fast import avx512
from .machine import machine
from .options import Decision

__all__ = [
    "dropout_masks_route",
    "kernel_note",
    "kernel_route",
    "kernels_wanted",
    "verdicts_wanted",
]

_LABELS = {
    "avx512_attention": "AVX-512 attention",
    "avx512_attention_bf16": "AVX-512 attention on bfloat16 rows",
    "avx512_linear": "AVX-512 linear",
    "avx512_linear_rows": "AVX-512 linear on a sentence's few rows",
    "avx512_flash": "AVX-512 flash attention (float32)",
    "avx512_flash_bf16": "AVX512-BF16 flash attention",
    "avx512_dropout": "AVX-512 dropout (counter-based masks)",
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
    if kernel not in avx512.kernels_here():
        return Decision("torch", f"{label}: this CPU has no AVX512-BF16")
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
        kept = f"cached {shown(path)}" if path is not None else "not cached"
        measured = f"{label}: {verdict.reason} on {key.cpu}, {kept}"
        if verdict.winner != "avx512":
            return Decision("torch", measured)
        taken = Decision("avx512", measured)
    if not avx512.is_loaded():  # a library built earlier is loaded here; nothing is compiled
        loaded = avx512.load(build=False)
        if loaded.choice != "loaded":
            return Decision("torch", f"{label}: the library is {loaded.choice}: {loaded.reason}")
    return taken


def dropout_masks_route() -> Decision:
    """``Decision("counter" | "torch", reason)``: the generator of a training run's dropout
    masks (:mod:`clearformer.dropout`), the counter-based one where ``auto`` takes the dropout
    kernel (:func:`kernel_route`). A run decides it once, before its first step."""
    taken = kernel_route(avx512.DROPOUT)
    return Decision("counter" if taken.choice == "avx512" else "torch", taken.reason)


def kernels_wanted(kernels: tuple[str, ...] = avx512.KERNELS) -> bool:
    """Whether clearformer's AVX-512 library (or one of ``kernels``) may be built and taken
    here: a CPU that can build it, with not every one of ``kernels`` switched off. Whether
    ``auto`` takes a kernel is :func:`kernel_route`'s answer."""
    if all(switches.kernel_setting(kernel).choice == "off" for kernel in kernels):
        return False
    return machine().avx512_available


def verdicts_wanted() -> bool:
    """Calibration on, a kernel left to ``auto``, and this CPU and build without a verdict for
    every kernel, or with provisional ones (measured while other processes were busy, by
    another process: :func:`clearformer.calibration.cache.settled`): a measurement would
    change what ``auto`` takes."""
    if not switches.calibration_enabled():
        return False
    here = avx512.kernels_here()
    settings = {switches.kernel_setting(kernel).choice for kernel in here}
    if "auto" not in settings:
        return False
    key = avx512.calibration_key()
    verdicts, _ = cached_verdicts(key)
    return not settled(key, verdicts, here)


def kernel_note(kernel: str) -> str:
    """What a decision's reason adds about ``kernel``: nothing on a CPU that cannot run it."""
    if not machine().avx512_available:
        return ""
    route = kernel_route(kernel)
    where = "clearformer's AVX-512 kernel" if route.choice == "avx512" else "PyTorch's route"
    return f"; {where} ({route.reason})"
