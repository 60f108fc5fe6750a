"""Timing: warm-up, repeats in interleaved rounds, medians.

Interleaving (every implementation once per round, in a rotating order) spreads slow phases of a
shared machine over all implementations instead of charging them to whichever ran at the time.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def best_seconds(fn: Callable[[], object], *, warmup: int = 1, repeats: int = 10) -> float:
    """The fastest of ``repeats`` calls: for ceilings (a rate the machine can reach)."""
    return min(interleaved({"fn": fn}, warmup=warmup, repeats=repeats)["fn"])


class Timings(dict):
    """Wall-clock seconds per call for each name (the dict), and the process CPU seconds of
    the same calls (``cpu``): work done, which other processes distort far less than waits."""

    def __init__(self, names) -> None:
        super().__init__({name: [] for name in names})
        self.cpu: dict[str, list[float]] = {name: [] for name in names}


def interleaved(
    fns: dict[str, Callable[[], object]], *, warmup: int = 1, repeats: int = 5
) -> Timings:
    """Seconds per call for each named function, ``repeats`` rounds after ``warmup`` rounds."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times = Timings(fns)
    names = list(fns)
    for round_ in range(repeats):
        # Rotate the order each round: no implementation always runs first (or right after a
        # heavy neighbour).
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            start, cpu = time.perf_counter(), time.process_time()
            fns[name]()
            times[name].append(time.perf_counter() - start)
            times.cpu[name].append(time.process_time() - cpu)
    return times
