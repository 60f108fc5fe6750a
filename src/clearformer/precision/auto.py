"""Which precision a call runs in, and why: a name given, or ``"auto"`` decided for this CPU.

``auto`` takes the fastest precision whose accuracy floor holds, in this order:

1. ``bf16`` where the CPU has AMX-BF16 tiles: bfloat16 products measured 2.7-3.0x float32's,
   embeddings within the bf16 floor (cosine to float32 >= 0.995 each, >= 0.9995 on average);
2. ``bf16`` where it has bfloat16 dot products without AMX (AVX512-BF16, ARM BF16) and a
   short measurement (:mod:`.speedup`, cached per CPU model and PyTorch version) finds
   bfloat16 products at least :data:`MIN_BF16_SPEEDUP` times as fast as float32's; the
   flags alone do not settle it there;
3. ``int8`` where it has int8 dot products (AVX512-VNNI, AVX-VNNI, AMX-INT8, ARM's dot
   products) and the caller runs int8 (``TextEncoder.encode``): int8 products about twice
   float32's, embeddings within int8's floor (cosine >= 0.99 each, >= 0.997 on average,
   docs/int8.md);
4. ``float32`` otherwise. Off the CPU (:func:`auto_off_cpu`): bf16 on an NVIDIA GPU of
   compute capability 8.0 or later, float32 on any other device.

The decision is a :class:`~clearformer.options.Decision`: its reason names the flags (and
the measurement) behind it, and ``encode`` logs it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..cpu import CpuInfo, cpu_info
from ..options import Decision
from .bf16 import bf16_support
from .names import PRECISIONS, check_precision, is_int8
from .speedup import SPEEDUP_VARIABLE, bf16_speedup, speedup_measured

# bfloat16 is taken without AMX when its products measure at least this much faster: the
# products are most but not all of a forward pass (attention, norms and the element-wise
# steps gain less), and bfloat16 costs some accuracy, so a marginal gain in the products
# would not pay.
MIN_BF16_SPEEDUP = 1.3

# The flags of int8 dot-product instructions (clearformer.quant.int8.INT8_CPU_FLAGS; named
# here so that deciding does not import the int8 code).
INT8_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8", "asimddp", "i8mm")


def auto_precision(
    cpu: CpuInfo | None = None,
    *,
    offered: tuple[str, ...] = ("float32", "bf16", "int8"),
    calibrate: bool | None = None,
    speedup: Callable[[CpuInfo], tuple[float, str]] | None = None,
) -> Decision:
    """What ``auto`` takes on ``cpu`` (default this machine's) among ``offered``, and why.

    Args:
        calibrate: measure where the flags do not settle it (None: unless
            ``CLEARFORMER_PRECISION_CALIBRATION=off``).
        speedup: ``cpu -> (bf16 speedup, where it came from)``; default
            :func:`~clearformer.precision.speedup.bf16_speedup` (cached measurement).
    """
    cpu = cpu_info() if cpu is None else cpu
    support = bf16_support(cpu)
    not_bf16 = ""  # why bf16 was passed over, where the CPU has bfloat16 instructions
    if "bf16" in offered and support.tiles:
        return Decision(
            "bf16",
            f"{support.reason}: bfloat16 products run several times faster than float32, "
            "within cosine 0.995 of float32",
        )
    if "bf16" in offered and support.native:
        if speedup_measured() if calibrate is None else calibrate:
            ratio, source = (speedup or bf16_speedup)(cpu)
            if ratio >= MIN_BF16_SPEEDUP:
                return Decision(
                    "bf16",
                    f"{support.reason}: bfloat16 products {ratio:.2f}x as fast as float32 "
                    f"(>= {MIN_BF16_SPEEDUP}; {source})",
                )
            not_bf16 = (
                f"{support.reason}: bfloat16 products only {ratio:.2f}x as fast as float32 "
                f"(< {MIN_BF16_SPEEDUP}; {source}); "
            )
        else:
            not_bf16 = (
                f"{support.reason}: bfloat16 not measured ({SPEEDUP_VARIABLE}=off), so not taken; "
            )
    int8_flags = [flag for flag in INT8_FLAGS if flag in cpu.flags]
    if "int8" in offered and int8_flags:
        return Decision(
            "int8",
            f"{not_bf16}int8 dot products ({', '.join(int8_flags)}): int8 products about "
            "twice as fast as float32, within cosine 0.99 of float32",
        )
    if not_bf16:
        return Decision("float32", not_bf16.rstrip("; "))
    missing = "no AMX-BF16, AVX512-BF16"
    missing += " or int8 dot products" if "int8" in offered and not int8_flags else ""
    if not cpu.flags:
        missing = "the CPU's flags could not be read"
    return Decision("float32", f"{missing}: float32 is the fastest accurate route here")


def choose_precision(
    precision: str,
    *,
    device: torch.device | str = "cpu",
    offered: tuple[str, ...] = ("float32", "bf16", "int8"),
    name: str = "precision",
    cpu: CpuInfo | None = None,
    calibrate: bool | None = None,
) -> Decision:
    """The precision a call of ``precision`` runs in on ``device``, and why.

    ``precision`` is checked first (:func:`~clearformer.precision.check_precision`: one of
    ``offered`` or ``"auto"``; ``"bfloat16"`` is ``"bf16"``). A name is taken as it is (int8
    where this machine has no int8 products: float32, as ``TextEncoder.int8_model`` runs);
    ``auto`` is :func:`auto_precision` on a CPU and :func:`auto_off_cpu` elsewhere (it never
    picks ``int8-blocks``, a choice of accuracy over speed); ``int8`` and ``int8-blocks`` on any
    device but the CPU are refused (ValueError). ``int8-blocks`` where its kernel cannot run
    (no AVX512-VNNI, no kernel library) runs float32.
    """
    precision = check_precision(precision, name, (*offered, "auto"))
    device = torch.device(device)
    if precision == "auto":
        if device.type != "cpu":
            return auto_off_cpu(device, offered)
        return auto_precision(cpu, offered=offered, calibrate=calibrate)
    if is_int8(precision):
        if device.type != "cpu":
            raise ValueError(
                f"{name}={precision!r} runs on CPUs only (its layers are CPU int8 kernels); on "
                f"{device} use 'bf16' or 'float32'"
            )
        available, reason = _int8_route(precision)
        if not available:
            return Decision("float32", f"{precision} requested, but {reason}")
        return Decision(precision, f"requested by name ({reason})")
    if precision == "bf16" and device.type == "cpu":
        support = bf16_support(cpu)
        if not support.native:
            return Decision(
                "bf16",
                f"requested by name; {support.reason}: bfloat16 products are emulated here, "
                "likely slower than float32",
            )
        return Decision("bf16", f"requested by name ({support.reason})")
    return Decision(precision, "requested by name")


def _int8_route(precision: str) -> tuple[bool, str]:
    """Whether an int8 precision's products run here, and why: int8's on the CPU's int8 dot
    products, int8-blocks' on its AVX512-VNNI kernel."""
    if precision == "int8-blocks":
        from ..quant.int8_blocks import block_kernel_support

        kernel = block_kernel_support()
        return kernel.choice == "available", kernel.reason
    from ..quant import int8_support

    support = int8_support()
    return support.available, support.reason


def auto_off_cpu(device: torch.device, offered: tuple[str, ...]) -> Decision:
    """What ``auto`` takes on a device other than the CPU: bf16 on a CUDA GPU of compute
    capability 8.0 or later (Ampere on), whose tensor cores multiply bfloat16 at several times
    their float32 rate with float32 sums, where bf16 is offered; float32 anywhere else."""
    # ROCm builds name their GPUs "cuda" too, with capabilities that are not NVIDIA's.
    nvidia = torch.version.hip is None
    if device.type == "cuda" and nvidia and "bf16" in offered and torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability(device)
        if major >= 8:
            return Decision(
                "bf16",
                f"CUDA device of compute capability {major}.{minor}: bfloat16 tensor-core "
                "products with float32 sums (the CPU's bf16 floor, cosine 0.995 to float32; "
                "not yet measured on a GPU)",
            )
        return Decision(
            "float32",
            f"CUDA device of compute capability {major}.{minor}: no bfloat16 tensor cores "
            "before 8.0, so float32",
        )
    return Decision(
        "float32", f"auto takes bf16 on NVIDIA GPUs from Ampere on; on {device} float32"
    )


__all__ = [
    "MIN_BF16_SPEEDUP",
    "PRECISIONS",
    "auto_off_cpu",
    "auto_precision",
    "choose_precision",
]
