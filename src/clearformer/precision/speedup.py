"""How much faster bfloat16 matrix products run than float32 ones on this CPU: measured once,
cached per CPU model and PyTorch version.

``precision="auto"`` decides from the CPU's instruction sets where they settle it (AMX tiles:
bfloat16; no bfloat16 instruction: not bfloat16). A CPU with bfloat16 dot products but no
AMX (AVX512-BF16 on AMD Zen 4 or Intel Cooper Lake, ARM's BF16) is not settled by its flags:
how much oneDNN gains there depends on the chip (Zen 4 runs its AVX-512 on 256-bit halves)
and on the oneDNN version PyTorch ships. There :func:`bf16_speedup` times one product of
MiniLM's feed-forward shape in both dtypes (well under a second), and keeps the ratio in a
verdict in clearformer's one store of measured verdicts (:mod:`clearformer.calibration.cache`,
in the cache folder), keyed by the CPU's model, vendor, family, flags and the PyTorch
version, written atomically, so every later process reads it instead of measuring.

``CLEARFORMER_PRECISION_CALIBRATION=off`` skips the measurement (a machine that must not spend
the time, or a test): ``auto`` then takes only what the flags settle. The two dtypes take turns
and the fastest call of each counts, so load from other processes moves the ratio little; to
measure again (after a change of machine image, say), delete the file.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from ..calibration import cache
from ..calibration.cache import CalibrationKey
from ..calibration.measure import Verdict
from ..cpu import CpuInfo, cpu_info

log = logging.getLogger(__name__)

SPEEDUP_VARIABLE = "CLEARFORMER_PRECISION_CALIBRATION"
# rows, inputs, outputs: MiniLM's first feed-forward product on a 4096-token batch split
# between encode's two workers; 2.4 GFLOP, about 12 ms in float32 on two Zen 4 cores.
SHAPE = (2048, 384, 1536)
REPEATS = 5  # timed calls per dtype, after two warm-up calls; the fastest counts


def speedup_measured() -> bool:
    """False when :data:`SPEEDUP_VARIABLE` says ``off`` (``0``, ``false``, ``no``)."""
    setting = os.environ.get(SPEEDUP_VARIABLE, "").strip().lower()
    if setting in ("", "1", "on", "true", "yes"):
        return True
    if setting in ("0", "off", "false", "no"):
        return False
    raise ValueError(f"{SPEEDUP_VARIABLE}: expected 'on' or 'off', got {setting!r}")


# The verdict's name in the store, and its candidates.
CHOICE = "bf16_products"


def speedup_key(cpu: CpuInfo, torch_version: str | None = None) -> CalibrationKey:
    """The verdict store's key of the measurement on ``cpu`` with this PyTorch version: the
    products are PyTorch's, so neither clearformer's version nor its kernels enter it; the
    CPU's flags do (a virtual machine may hide a model's generation, not its instructions)."""
    import torch

    version = torch.__version__ if torch_version is None else torch_version
    flags = hashlib.sha256(" ".join(sorted(cpu.flags)).encode()).hexdigest()[:12]
    described = f"{cpu.model} ({cpu.vendor} family {cpu.family}; flags {flags})"
    return CalibrationKey(described, version, "", "")


def cache_path(cpu: CpuInfo, torch_version: str | None = None) -> Path:
    """The verdict file that holds the measurement for ``cpu`` and this PyTorch version."""
    return speedup_key(cpu, torch_version).path()


def bf16_speedup(
    cpu: CpuInfo | None = None, *, measure: Callable[[], float] | None = None
) -> tuple[float, str]:
    """(float32 time / bfloat16 time of one product, where the figure came from): read from
    the verdict store (:mod:`clearformer.calibration.cache`) for this CPU and PyTorch version,
    else measured (``measure``, default :func:`measure_bf16_speedup`) and kept there. A store
    that cannot be written (a read-only home) costs a warning and a measurement per process,
    nothing else."""
    import torch

    cpu = cpu_info() if cpu is None else cpu
    key = speedup_key(cpu)
    try:
        path = key.path()
    except OSError:  # no cache folder: measured in each process, as a read-only one is
        path = None
    verdict = (cache.read(key) or {}).get(CHOICE)
    ratio = None if verdict is None else verdict.speedups.get("bf16")
    if ratio is not None and ratio > 0:
        return ratio, f"measured earlier, cached in {path}"
    started = time.perf_counter()
    ratio = float((measure or measure_bf16_speedup)())
    log.info(
        "measured bfloat16 products at %.2fx float32's in %.2fs",
        ratio,
        time.perf_counter() - started,
    )
    verdict = Verdict(
        choice=CHOICE,
        baseline="float32",
        winner="bf16" if ratio > 1.0 else "float32",
        speedups={"float32": 1.0, "bf16": ratio},
        seconds={},
        margin=0.0,
        rounds=REPEATS,
        reason=f"bfloat16 products at {ratio:.2f}x float32's ({'x'.join(map(str, SHAPE))})",
        context={"threads": torch.get_num_threads(), "shape": list(SHAPE)},
    )
    try:
        cache.write(key, {CHOICE: verdict})
    except OSError as error:
        log.warning("could not cache the bfloat16 measurement: %s", error)  # names the file
        return ratio, "measured now (not cached)"
    return ratio, f"measured now, cached in {path}"


def measure_bf16_speedup(shape: tuple[int, int, int] = SHAPE, repeats: int = REPEATS) -> float:
    """Time ``F.linear`` on (rows, inputs) x (outputs, inputs) in float32 and in bfloat16 at
    this process's thread count: the ratio float32 / bfloat16 of the fastest calls."""
    import torch
    import torch.nn.functional as F

    rows, inputs, outputs = shape
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(rows, inputs, generator=generator)
    w = torch.randn(outputs, inputs, generator=generator) * inputs**-0.5
    operands = {dtype: (x.to(dtype), w.to(dtype)) for dtype in (torch.float32, torch.bfloat16)}
    best = dict.fromkeys(operands, float("inf"))
    with torch.inference_mode():
        for a, b in operands.values():
            for _ in range(2):  # warm-up: oneDNN builds its kernel for the shape on first use
                F.linear(a, b)
        # The dtypes take turns, so that a burst of load from another process slows both.
        for _ in range(repeats):
            for dtype, (a, b) in operands.items():
                started = time.perf_counter()
                F.linear(a, b)
                best[dtype] = min(best[dtype], time.perf_counter() - started)
    return best[torch.float32] / max(best[torch.bfloat16], 1e-9)
