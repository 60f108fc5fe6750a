"""Progress of long work, told as the log records of one logger, ``clearformer.progress``.

Library code never prints. Work that keeps a person waiting for seconds says what it is doing
instead: a line as each phase starts (:func:`phase`: "calibrating kernels for this CPU (once
per machine)...") and, where it has a count, how far it is, how fast it goes and how long is
left at that pace (:class:`Meter`). Both are INFO records of this one logger, so a program
sees them only if it asks (``logging.basicConfig(level=logging.INFO)``), while the
``clearformer`` command line shows them on stderr by default (``clearformer.cli``).

Imports nothing but the standard library: the command line attaches its handler before any
command has imported torch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

LOGGER_NAME = "clearformer.progress"

log = logging.getLogger(LOGGER_NAME)


def phase(message: str) -> None:
    """Say that a phase of long work starts (one line, ending in "...")."""
    log.info("%s...", message)


def duration(seconds: float) -> str:
    """``seconds`` as a person reads a wait: "8 s", "2 min 05 s", "1 h 02 min"."""
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


def pace(done: int, total: int, elapsed: float, unit: str) -> str:
    """How fast ``done`` of ``total`` went in ``elapsed`` seconds and how long the rest takes
    at that pace: "3.42 steps/s, ETA 7 min 18 s"; "" before anything is done."""
    if done <= 0 or elapsed <= 0:
        return ""
    rate = done / elapsed
    shown = f"{rate:,.0f}" if rate >= 100 else f"{rate:.3g}"
    left = "" if done >= total else f", ETA {duration((total - done) / rate)}"
    return f"{shown} {unit}/s{left}"


class Meter:
    """Counts ``total`` items of long work from its creation; :meth:`report` logs how far it
    is, its pace and the time left."""

    def __init__(
        self, what: str, total: int, unit: str, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.what, self.total, self.unit, self.clock = what, total, unit, clock
        self.started = clock()

    def line(self, done: int) -> str:
        """ "what: done/total unit, rate unit/s, ETA ..." (no pace before the first item)."""
        counted = f"{self.what}: {done:,}/{self.total:,} {self.unit}"
        speed = pace(done, self.total, self.clock() - self.started, self.unit)
        return f"{counted}, {speed}" if speed else counted

    def report(self, done: int) -> None:
        log.info("%s", self.line(done))
