"""How many CPUs other processes leave free, read from the kernel's tick counters.

An OpenMP parallel region ends when its slowest thread does. When another process keeps one
CPU busy, the scheduler shares that CPU between it and one of ours, and every parallel region
of a forward pass on all the CPUs waits for the thread that is descheduled: a small forward
pass with hundreds of regions becomes many times slower, while the same pass on the CPUs that
are actually free runs at its normal speed (docs/serving.md). A caller that picks a thread
count per forward pass therefore asks :class:`FreeCpus` first.

The reading: all CPUs' busy ticks in ``/proc/stat`` since the last reading, less this
process's own (``/proc/self/stat``), is how many CPUs the others kept busy. Readings are at
least :data:`MIN_INTERVAL` apart (ticks are 10 ms; a shorter interval measures noise); between
them the last estimate stands. Where ``/proc`` cannot be read (not Linux), every CPU counts as
free: the behaviour without this module.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

MIN_INTERVAL = 0.2  # seconds between two readings
# A CPU this far from free still counts in threads_for (1 - FREE_ENOUGH of it busy at most).
FREE_ENOUGH = 0.75
PROC = Path("/proc")


def parse_proc_stat(text: str) -> tuple[int, int] | None:
    """(busy, total) ticks of all CPUs from ``/proc/stat``'s ``cpu`` line: busy is user, nice,
    system, irq, softirq and steal (time a hypervisor gave another guest: load too), total
    adds idle and iowait (guest time is already inside user)."""
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            values = [int(v) for v in fields[1:9]] + [0] * max(0, 9 - len(fields))
            user, nice, system, idle, iowait, irq, softirq, steal = values[:8]
            busy = user + nice + system + irq + softirq + steal
            return busy, busy + idle + iowait
    return None


def parse_pid_stat(text: str) -> tuple[int, int]:
    """(parent pid, utime + stime + cutime + cstime) from ``/proc/<pid>/stat`` (the command
    name, in parentheses, may hold spaces: the fields are read after its last ``)``)."""
    fields = text.rsplit(")", 1)[1].split()
    # fields[0] is the state; ppid is field 4 of the file, utime..cstime fields 14-17.
    return int(fields[1]), sum(int(v) for v in fields[11:15])


def read_counters(proc: Path = PROC) -> tuple[int, int, int] | None:
    """(all CPUs' busy ticks, all CPUs' total ticks, this process's ticks), or None."""
    try:
        machine = parse_proc_stat((proc / "stat").read_text())
        _, own = parse_pid_stat((proc / "self" / "stat").read_text())
    except (OSError, IndexError, ValueError):
        return None
    if machine is None:
        return None
    return machine[0], machine[1], own


class FreeCpus:
    """An estimate of the CPUs that other processes leave free, renewed as it is asked for.

    ``read``, ``clock`` and ``cpus`` are for tests (fake counters and time).
    """

    def __init__(
        self,
        cpus: int | None = None,
        *,
        read: Callable[[], tuple[int, int, int] | None] = read_counters,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cpus = cpus or os.cpu_count() or 1
        self._read = read
        self._clock = clock
        self._lock = threading.Lock()
        self._last = read()
        self._last_time = clock()
        self._others = 0.0  # CPUs kept busy by other processes, as last measured

    def others(self) -> float:
        """CPUs other processes kept busy between the last two readings (0 before any)."""
        with self._lock:
            now = self._clock()
            if self._last is None or now - self._last_time < MIN_INTERVAL:
                return self._others
            reading = self._read()
            if reading is None:
                return self._others
            busy, total, own = (a - b for a, b in zip(reading, self._last, strict=True))
            if total > 0:
                self._others = max(0.0, min(self.cpus, (busy - own) / total * self.cpus))
            self._last, self._last_time = reading, now
            return self._others

    def threads_for(self, wanted: int, of: int) -> int:
        """Threads for a forward pass that would take ``wanted`` of the process's ``of``
        threads on a free machine: its part of the CPUs the others leave, at least 1. A CPU
        counts while it is at least a quarter free: a process that keeps a CPU wholly busy
        stalls every parallel region of a thread that shares it (docs/serving.md), while the
        light, bursty use of a client on the same machine (a few tenths of a CPU) does not."""
        free = self.cpus - self.others()
        return max(1, min(wanted, math.floor(wanted * min(of, free) / of + FREE_ENOUGH)))
