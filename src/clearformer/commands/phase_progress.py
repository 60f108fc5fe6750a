"""Progress of a command's phases on stderr: done / total, rate and time left (worded as
:mod:`clearformer.progress` words them).

On a terminal one line per phase is redrawn in place; elsewhere (a log file, CI) a line is
written when a phase starts, at most every ``interval`` seconds while it runs, and when it ends,
so a long run is never silent and its log stays short.
"""

from __future__ import annotations

import sys
import time

from ..progress import duration, pace


class PhaseProgress:
    """Call with (phase, done, total, unit) as work finishes; ``enabled=False`` is silent."""

    def __init__(self, command: str, enabled: bool = True, interval: float = 10.0) -> None:
        self.command = command
        self.enabled = enabled
        self.interval = interval
        self.terminal = sys.stderr.isatty()
        self._phase: str | None = None
        self._start = 0.0
        self._last = 0.0

    def __call__(self, phase: str, done: int, total: int, unit: str = "texts") -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if phase != self._phase:
            self._phase, self._start, self._last = phase, now, 0.0
            if not self.terminal:
                print(f"{self.command}: {phase}: {total:,} {unit}", file=sys.stderr, flush=True)
        finished = done >= total
        if not self.terminal and not finished and now - self._last < self.interval:
            return
        self._last = now
        elapsed = now - self._start
        speed = pace(done, total, elapsed, unit)  # "12.3 texts/s, ETA 1 min 05 s"
        took = f" in {duration(elapsed)}" if finished else ""
        line = (
            f"{self.command}: {phase}: {done:,}/{total:,} {unit}"
            + (f", {speed}" if speed else "")
            + took
        )
        if self.terminal:
            print(f"\r\033[K{line}", end="\n" if finished else "", file=sys.stderr, flush=True)
        elif done > 0:
            print(line, file=sys.stderr, flush=True)
