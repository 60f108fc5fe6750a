"""Progress of a long ``encode`` call: a caller's function, a tqdm bar, or log lines; and the
rate and time left of any long job counted in items (:class:`Throughput`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

# The lines keep the name of the logger they were always written to (encode's module).
log = logging.getLogger("clearformer.text.encoder")

ProgressFn = Callable[[int, int], None]  # (texts done, texts in all)
LOG_PROGRESS_MIN = 2048  # texts; below this an encode call is short enough to need no progress


def check_progress(progress: object) -> None:
    """Refuse a ``progress`` argument that is not None, a bool or a callable (done, total)."""
    if not (progress is None or isinstance(progress, bool) or callable(progress)):
        raise TypeError(
            f"progress must be None, True, False or a callable (done, total), got {progress!r}"
        )


def progress_reporter(progress: bool | ProgressFn | None, total: int) -> ProgressFn:
    """What ``encode`` calls as texts finish: ``progress`` itself when it is a function, a tqdm
    bar for True (where tqdm is installed), a log line every tenth of the texts for None on
    long calls, nothing for False or a short call."""
    if callable(progress):
        return progress
    if progress is True:
        try:
            from tqdm.auto import tqdm
        except ImportError:
            pass
        else:
            bar = tqdm(total=total, unit="text", desc="encode")

            def update(done: int, total: int) -> None:
                bar.update(done - bar.n)
                if done >= total:
                    bar.close()

            return update
    if progress is False or (progress is None and total < LOG_PROGRESS_MIN):
        return lambda done, total: None
    step = max(total // 10, 1)
    state = {"next": step}

    def log_progress(done: int, total: int) -> None:
        if done >= state["next"] or done == total:
            log.info("encoded %d / %d texts", done, total)
            state["next"] = done + step

    return log_progress


class Throughput:
    """The rate of a job counted in items, and the time it has left, from its (done, total)
    reports.

    The rate is over the items done since the first report, so the items a resumed job found
    already done (a killed build's committed chunks) do not count as done fast.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._first: tuple[float, int] | None = None  # (time, done) of the first report

    def update(self, done: int, total: int) -> tuple[float | None, float | None]:
        """(items per second, seconds left); None for what cannot be told yet."""
        now = self._clock()
        if self._first is None:
            self._first = (now, done)
        started, done_before = self._first
        elapsed, counted = now - started, done - done_before
        if elapsed <= 0 or counted <= 0:
            return None, None
        rate = counted / elapsed
        return rate, max(total - done, 0) / rate


def describe_progress(
    done: int, total: int, unit: str, rate: float | None, left: float | None
) -> str:
    """``4,096/10,000 texts, 412 texts/s, 0:14 left`` (the rate and the time left where known)."""
    parts = [f"{done:,}/{total:,} {unit}"]
    if rate is not None:
        parts.append(f"{rate:,.0f} {unit}/s" if rate >= 10 else f"{rate:.1f} {unit}/s")
    if left is not None and done < total:
        parts.append(f"{clock_time(left)} left")
    return ", ".join(parts)


def clock_time(seconds: float) -> str:
    """Seconds as ``M:SS`` or ``H:MM:SS``."""
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"
