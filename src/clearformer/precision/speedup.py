"""How much faster bfloat16 matrix products run than float32 ones on this CPU: measured once,
cached per CPU model and PyTorch version.

``precision="auto"`` decides from the CPU's instruction sets where they settle it (AMX tiles:
bfloat16; no bfloat16 instruction: not bfloat16). A CPU with bfloat16 dot products but no
AMX (AVX512-BF16 on AMD Zen 4 or Intel Cooper Lake, ARM's BF16) is not settled by its flags:
how much oneDNN gains there depends on the chip (Zen 4 runs its AVX-512 on 256-bit halves)
and on the oneDNN version PyTorch ships. There :func:`bf16_speedup` times one product of
MiniLM's feed-forward shape in both dtypes (well under a second), and keeps the ratio in a
small JSON file under ``precision/`` in clearformer's cache folder
(:func:`clearformer.machine.cache_folder`),
named by a hash of the CPU's model, vendor, family, flags and the PyTorch version, written
atomically, so every later process reads it instead of measuring.

``CLEARFORMER_PRECISION_CALIBRATION=off`` skips the measurement (a machine that must not spend
the time, or a test): ``auto`` then takes only what the flags settle. The two dtypes take turns
and the fastest call of each counts, so load from other processes moves the ratio little; to
measure again (after a change of machine image, say), delete the file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from ..cpu import CpuInfo, cpu_info
from ..io import atomic_write
from ..machine import cache_folder

log = logging.getLogger(__name__)

SPEEDUP_VARIABLE = "CLEARFORMER_PRECISION_CALIBRATION"
# rows, inputs, outputs: MiniLM's first feed-forward product on a 4096-token batch split
# between encode's two workers; 2.4 GFLOP, about 12 ms in float32 on two Zen 4 cores.
SHAPE = (2048, 384, 1536)
REPEATS = 5  # timed calls per dtype, after two warm-up calls; the fastest counts
FORMAT = 1  # the cache file's layout; another one is measured again


def speedup_measured() -> bool:
    """False when :data:`SPEEDUP_VARIABLE` says ``off`` (``0``, ``false``, ``no``)."""
    setting = os.environ.get(SPEEDUP_VARIABLE, "").strip().lower()
    if setting in ("", "1", "on", "true", "yes"):
        return True
    if setting in ("0", "off", "false", "no"):
        return False
    raise ValueError(f"{SPEEDUP_VARIABLE}: expected 'on' or 'off', got {setting!r}")


def cache_path(cpu: CpuInfo, torch_version: str | None = None) -> Path:
    """The file that holds the measurement for ``cpu`` and this PyTorch version."""
    import torch

    version = torch.__version__ if torch_version is None else torch_version
    key = hashlib.sha256()
    for part in (cpu.model, cpu.vendor, cpu.family, " ".join(sorted(cpu.flags)), version):
        key.update(part.encode("utf-8", "replace") + b"\0")
    return cache_folder() / "precision" / f"bf16-speedup-{key.hexdigest()[:16]}.json"


def bf16_speedup(
    cpu: CpuInfo | None = None, *, measure: Callable[[], float] | None = None
) -> tuple[float, str]:
    """(float32 time / bfloat16 time of one product, where the figure came from): read from
    the cache file of this CPU and PyTorch version, else measured (``measure``, default
    :func:`measure_bf16_speedup`) and written there. A cache that cannot be written (a
    read-only home) costs a warning and a measurement per process, nothing else."""
    import torch

    cpu = cpu_info() if cpu is None else cpu
    path = cache_path(cpu)
    cached = _read(path, cpu, torch.__version__)
    if cached is not None:
        return cached, f"measured earlier, cached in {path}"
    started = time.perf_counter()
    speedup = float((measure or measure_bf16_speedup)())
    log.info(
        "measured bfloat16 products at %.2fx float32's in %.2fs",
        speedup,
        time.perf_counter() - started,
    )
    record = {
        "format": FORMAT,
        "cpu": cpu.model,
        "vendor": cpu.vendor,
        "family": cpu.family,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "shape": list(SHAPE),
        "bf16_speedup": speedup,
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_write(path) as handle:
            json.dump(record, handle, indent=1)
    except OSError as error:
        log.warning("could not cache the bfloat16 measurement in %s: %s", path, error)
        return speedup, "measured now (not cached)"
    return speedup, f"measured now, cached in {path}"


def _read(path: Path, cpu: CpuInfo, version: str) -> float | None:
    """The cached speedup, or None where the file is missing, unreadable or another one's."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        speedup = float(record["bf16_speedup"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    same = (
        record.get("format") == FORMAT
        and record.get("cpu") == cpu.model
        and record.get("torch") == version
    )
    return speedup if same and speedup > 0 else None


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
