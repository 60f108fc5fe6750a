"""Timing: warm-up, repeats in interleaved rounds, medians.

Interleaving (every implementation once per round) spreads slow phases of a shared machine over
all implementations instead of charging them to whichever ran at the time.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_seconds(fn: Callable[[], object], *, warmup: int = 1, repeats: int = 5) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def interleaved(
    fns: dict[str, Callable[[], object]], *, warmup: int = 1, repeats: int = 5
) -> dict[str, list[float]]:
    """Seconds per call for each named function, ``repeats`` rounds after ``warmup`` rounds."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times
