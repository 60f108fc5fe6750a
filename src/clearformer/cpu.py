"""What the CPU is: its model and the instruction sets the kernels choose between.

The same code runs at very different speeds on different CPUs, and not all alike: oneDNN's
float32 products use AVX-512 on any CPU that has it, while MKL's (``torch.matmul``, ATen's
batched products, the CPU flash-attention kernel) run their AVX2 code on AMD processors. A
benchmark figure therefore means little without the machine it was taken on: every result
file records :func:`cpu_description` (``clearformer.bench``). int8 asks
:func:`cpu_info` whether the CPU has int8 dot-product instructions.
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path

# The flags that change which kernels run (x86 names as /proc/cpuinfo spells them; ARM's
# "asimddp" and "i8mm" are its int8 dot products).
NOTABLE_FLAGS = (
    "avx2",
    "fma",
    "avx512f",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "avx_vnni",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
    "asimddp",
    "i8mm",
    "sve",
)


@dataclass(frozen=True)
class CpuInfo:
    model: str  # as the OS names it ("AMD EPYC", "Intel(R) Xeon(R) Platinum 8488C")
    vendor: str  # "AuthenticAMD", "GenuineIntel", "" where unknown
    family: str  # CPU family and model numbers ("26 / 2"): a virtual machine often hides the
    #              model's full name, and these still tell its generation
    logical_cpus: int
    flags: frozenset[str] = field(default_factory=frozenset)  # empty where unread
    virtualised: bool = False  # a hypervisor: another guest may share the cores

    def notable_flags(self) -> list[str]:
        """The :data:`NOTABLE_FLAGS` this CPU has, in that order."""
        return [flag for flag in NOTABLE_FLAGS if flag in self.flags]

    def summary(self) -> str:
        """One line: ``AMD EPYC (AuthenticAMD family 26 / 2), 2 CPUs, avx2 fma avx512f ...``."""
        origin = " ".join(part for part in (self.vendor, f"family {self.family}") if part)
        notable = self.notable_flags()
        extensions = " ".join(notable) if notable else "flags unread"
        guest = ", virtual machine" if self.virtualised else ""
        return f"{self.model} ({origin}), {self.logical_cpus} CPUs{guest}: {extensions}"


def parse_cpuinfo(text: str, logical_cpus: int | None = None) -> CpuInfo:
    """:class:`CpuInfo` from the text of Linux's ``/proc/cpuinfo`` (the first processor's
    entries; x86 and ARM spellings)."""
    entries: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        key = key.strip()
        if sep and key not in entries:  # the first processor's value
            entries[key] = value.strip()
    flags = frozenset((entries.get("flags") or entries.get("Features") or "").split())
    model = entries.get("model name") or entries.get("Model") or platform.processor() or "unknown"
    family = " / ".join(
        entries[key] for key in ("cpu family", "model") if entries.get(key, "").isdigit()
    )
    if not family and "CPU implementer" in entries:  # ARM: implementer / part
        family = f"{entries['CPU implementer']} / {entries.get('CPU part', '?')}"
    return CpuInfo(
        model=model,
        vendor=entries.get("vendor_id", ""),
        family=family,
        logical_cpus=logical_cpus if logical_cpus is not None else (os.cpu_count() or 1),
        flags=flags,
        virtualised="hypervisor" in flags,
    )


@functools.cache
def cpu_info() -> CpuInfo:
    """This machine's CPU (read once per process); where ``/proc/cpuinfo`` cannot be read, what
    :mod:`platform` says, with no flags."""
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    return parse_cpuinfo(text)


def cpu_description() -> dict:
    """:func:`cpu_info` as a result file records it, with the SIMD level PyTorch's own kernels
    chose (``torch.backends.cpu.get_cpu_capability``)."""
    import torch

    info = cpu_info()
    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except (AttributeError, RuntimeError):
        capability = "unknown"
    return {
        "model": info.model,
        "vendor": info.vendor,
        "family": info.family,
        "logical_cpus": info.logical_cpus,
        "virtualised": info.virtualised,
        "notable_flags": info.notable_flags(),
        "torch_cpu_capability": capability,
        "summary": info.summary(),
    }
