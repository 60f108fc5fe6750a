"""Peak extra memory of one forward pass, measured in a fresh process.

CPU tensors come from ``malloc``, so the honest figure is the process's resident-set high-water
mark, ``VmHWM`` in ``/proc/self/status``. A fresh Python process builds the layer and its
input, resets the high-water mark to the current resident set (``/proc/self/clear_refs``),
runs one forward under ``inference_mode`` and reports how far the mark rose. (``getrusage``'s
``ru_maxrss`` will not do: Linux carries it over from the parent across ``fork`` and ``exec``.)
A fresh process per measurement means no earlier run's peak hides this one's. The allocator
setting is the suite's (``retain_freed_memory``), as in the timed runs.

Run as ``python -m clearformer.bench.memory --impl NAME --size minilm --seqlen T --output PATH``;
writes the result to ``PATH`` as JSON. A file rather than stdout, so nothing a library prints
while the layer is built can be mistaken for the result (:func:`measure` reads it back).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from ..io import atomic_write
from .workloads import SIZES


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _high_water_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # reported in kB
    raise OSError("VmHWM not found in /proc/self/status")


def _reset_high_water() -> None:
    """Set the high-water mark to the current resident set (Linux >= 4.0); best effort."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass  # a fresh process's mark holds only the setup, which is small


def measure_here(impl: str, size_name: str, seqlen: int, threads: int) -> dict:
    """Build one layer of ``impl`` and measure one forward on ``(1, seqlen, D)``."""
    from ..runtime import retain_freed_memory
    from .peers import find_peer

    retain_freed_memory()
    torch.set_num_threads(threads)
    peer = find_peer(impl)
    size = SIZES[size_name]
    model = peer.build(size, 1).eval()
    x = torch.randn(1, seqlen, size.d_model)  # (1, T, D)
    _reset_high_water()
    before = _rss_bytes()
    start = time.perf_counter()
    with torch.inference_mode():
        peer.run(model, x, None)
    seconds = time.perf_counter() - start
    peak = max(0, _high_water_bytes() - before)
    return {"impl": impl, "seqlen": seqlen, "peak_extra_bytes": peak, "seconds": seconds}


def measure(impl: str, size_name: str, seqlen: int, threads: int, timeout: float = 600) -> dict:
    """:func:`measure_here` in a fresh Python process, which writes its result to a file in a
    temporary folder. Its stdout and stderr are captured (kept off the caller's output); the
    last line of stderr names a failure."""
    with tempfile.TemporaryDirectory(prefix="clearformer-memory-") as folder:
        output = Path(folder) / "result.json"
        cmd = [
            sys.executable, "-m", "clearformer.bench.memory",
            "--impl", impl, "--size", size_name, "--seqlen", str(seqlen), "--threads", str(threads),
            "--output", str(output),
        ]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0 or not output.is_file():
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"memory measurement of {impl} at T={seqlen} failed: {tail}")
        return json.loads(output.read_text(encoding="utf-8"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m clearformer.bench.memory")
    parser.add_argument("--impl", required=True)
    parser.add_argument("--size", default="minilm", choices=sorted(SIZES))
    parser.add_argument("--seqlen", type=int, required=True)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--output", required=True, help="the JSON file to write the result to")
    args = parser.parse_args(argv)
    result = measure_here(args.impl, args.size, args.seqlen, args.threads)
    with atomic_write(args.output) as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
