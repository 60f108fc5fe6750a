"""How busy the machine was: a benchmark taken while other processes ran is flagged.

On a shared machine other processes slow every implementation, but not equally: torch.nn's
nested-tensor path slows 2-4x under load, clearformer's packed path much less, so a loaded run
flatters clearformer (docs/performance.md). Every result therefore says whether the run was
quiet, and why not.

The verdict counts other processes' CPU time directly, from the kernel's tick counters
(:class:`LoadMeter`): the 1-minute load average lags by a minute, so a run started right
after another inherits its predecessor's threads, and it counts the run's own threads too.

* **Before the run**, a short idle probe (``PROBE_SECONDS``, this process asleep): all CPUs'
  busy ticks in ``/proc/stat`` over it, less this process tree's own (``/proc/<pid>/stat`` of
  this process and every live descendant, reaped children included), is how many CPUs other
  processes keep busy right now.
* **Over the run**, the same difference between the start and the end: other processes'
  average busy CPUs while the benchmark ran. Its own threads, and its child processes (a
  server it started) while they live, are not counted.

The run is LOADED when others kept more than ``MARGIN_CPUS`` busy before or during it. The
load averages stay in the record for information; where ``/proc/stat`` cannot be read (not
Linux) the verdict falls back to them (:func:`judge`). Process CPU time per call, recorded
beside wall time, is the cross-check that load distorts less: it counts the work done, not the
waits. The record also names the CPU (:mod:`clearformer.cpu`): figures from two machines do
not compare; and the route ``auto`` takes for each of clearformer's own kernels
(:func:`routes_taken`): figures taken with and without them do not compare either.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..free_cpus import parse_pid_stat, parse_proc_stat

# Other processes may keep this much of one CPU busy, on average, before a run is LOADED: a
# quiet machine's daemons and this benchmark's own bookkeeping outside its process stay well
# below it; one busy process elsewhere is four times more.
MARGIN_CPUS = 0.25
PROBE_SECONDS = 1.5  # the idle probe before a run
# The load-average fallback: a quiet machine's 1-minute load average before a run, and how far
# above the benchmark's own threads it may end.
QUIET_BEFORE = 0.5
QUIET_MARGIN = 0.5
PROC = Path("/proc")


@dataclass(frozen=True)
class LoadRecord:
    """Whether a run was quiet, why not, and what was read.

    Attributes:
        before, after: the load averages (1, 5, 15 minutes) at the start and the end.
        threads: the benchmark's own threads. cores: the machine's logical CPUs.
        loaded: other processes were busy beyond the margin.
        reason: why (one line).
        cpu: :meth:`clearformer.cpu.CpuInfo.summary` of the machine that ran it.
        others_before: CPUs other processes kept busy during the idle probe (None: no probe).
        others_during: their average busy CPUs over the run (None: not counted).
        own_during: this process tree's average busy CPUs over the run.
        method: ``proc-stat`` (ticks counted) or ``load average`` (the fallback).
        margin: the CPUs others may keep busy in a quiet run.
        routes: what ``auto`` took for each of clearformer's own kernels (:func:`routes_taken`).
    """

    before: tuple[float, float, float]
    after: tuple[float, float, float]
    threads: int
    cores: int
    loaded: bool
    reason: str
    cpu: str = ""
    others_before: float | None = None
    others_during: float | None = None
    own_during: float | None = None
    method: str = "load average"
    margin: float = MARGIN_CPUS
    routes: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        state = "LOADED" if self.loaded else "quiet"
        if self.others_during is not None:
            probe = "" if self.others_before is None else f"{self.others_before:.2f} before, "
            counted = (
                f"other processes busy on {probe}{self.others_during:.2f} during the run of "
                f"{self.cores} CPUs (the run's own {self.own_during:.2f} not counted), load "
                f"average {self.before[0]:.2f} -> {self.after[0]:.2f}"
            )
        else:
            counted = (
                f"load average {self.before[0]:.2f} before, {self.after[0]:.2f} after "
                f"({self.threads} benchmark threads, {self.cores} cores)"
            )
        routes = ", ".join(f"{k} {v.split(' ')[0]}" for k, v in self.routes.items())
        return (
            f"{state}: {counted}; {self.reason}"
            + (f". CPU: {self.cpu}" if self.cpu else "")
            + (f". Routes: {routes}" if routes else "")
        )


def load_average() -> tuple[float, float, float]:
    try:
        return os.getloadavg()
    except OSError:  # a platform without it: unknown counts as not quiet
        return (float("nan"),) * 3


def judge(
    before: tuple[float, float, float], after: tuple[float, float, float], threads: int
) -> LoadRecord:
    """The fallback verdict from two load-average readings, where ticks cannot be read:
    whether the run between them was quiet, and why not."""
    cores = os.cpu_count() or 1
    if before[0] != before[0] or after[0] != after[0]:  # NaN
        loaded, reason = True, "the load average is unavailable on this platform"
    elif before[0] > QUIET_BEFORE:
        loaded, reason = True, f"other processes were busy before the run (> {QUIET_BEFORE})"
    elif after[0] > threads + QUIET_MARGIN:
        loaded, reason = (
            True,
            (f"the load rose above the benchmark's own {threads} threads + {QUIET_MARGIN}"),
        )
    else:
        loaded, reason = False, "no other process was busy"
    return LoadRecord(
        tuple(before),
        tuple(after),
        threads,
        cores,
        loaded,
        reason,
        _cpu_summary(),
        routes=routes_taken(),
    )


@dataclass(frozen=True)
class Ticks:
    """One reading: all CPUs' busy and total ticks (``/proc/stat``), and the ticks of each
    process of this benchmark's tree (pid -> user + system time, its reaped children's
    included), all in the kernel's clock ticks."""

    busy: int
    total: int
    tree: dict[int, int]


def others_busy(start: Ticks, end: Ticks, cpus: int) -> tuple[float, float]:
    """(others', own) average busy CPUs between two readings. A process of the tree that
    ended between them was reaped by its parent, whose count then holds its whole time: its
    count at ``start`` is taken off again."""
    elapsed = max(end.total - start.total, 1)  # CPU-ticks, all CPUs together
    own = sum(ticks - start.tree.get(pid, 0) for pid, ticks in end.tree.items())
    own -= sum(ticks for pid, ticks in start.tree.items() if pid not in end.tree)
    own = max(own, 0)
    others = max(end.busy - start.busy - own, 0)
    return others / elapsed * cpus, own / elapsed * cpus


class LoadMeter:
    """Counts other processes' CPU time around a run. ``start()`` before it (the idle probe),
    ``record()`` after it (at any point: each call covers the run so far)::

        meter = LoadMeter(threads=torch.get_num_threads()).start()
        ...  # the run
        record = meter.record()

    ``read``, ``sleep`` and ``cpus`` are for tests (fake readings); ``exclude`` names pids of
    this tree whose CPU counts as others' (load a benchmark starts on purpose)."""

    def __init__(
        self,
        threads: int,
        *,
        probe_seconds: float = PROBE_SECONDS,
        margin: float = MARGIN_CPUS,
        read: Callable[[], Ticks | None] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        cpus: int | None = None,
        exclude: Callable[[], Iterable[int]] = tuple,
    ) -> None:
        self.threads = threads
        self.probe_seconds = probe_seconds
        self.margin = margin
        self._read = read or (lambda: read_ticks(exclude=set(exclude())))
        self._sleep = sleep
        self.cpus = cpus or os.cpu_count() or 1
        self._load_before = (float("nan"),) * 3
        self._start: Ticks | None = None
        self._others_before: float | None = None

    def start(self) -> LoadMeter:
        self._load_before = load_average()
        first = self._read()
        if first is not None and self.probe_seconds > 0:
            self._sleep(self.probe_seconds)
            second = self._read()
            if second is not None:
                self._others_before = others_busy(first, second, self.cpus)[0]
                first = second
        self._start = first
        return self

    def record(self) -> LoadRecord:
        after = load_average()
        end = self._read() if self._start is not None else None
        if end is None:
            return judge(self._load_before, after, self.threads)
        others, own = others_busy(self._start, end, self.cpus)
        busy = [
            f"{value:.2f} CPUs {when}"
            for value, when in ((self._others_before, "before"), (others, "during the run"))
            if value is not None and value > self.margin
        ]
        if busy:
            loaded = True
            reason = f"others above the {self.margin}-CPU margin ({' and '.join(busy)})"
        else:
            loaded, reason = False, f"others within the {self.margin}-CPU margin"
        return LoadRecord(
            tuple(self._load_before),
            tuple(after),
            self.threads,
            self.cpus,
            loaded,
            reason,
            _cpu_summary(),
            others_before=self._others_before,
            others_during=others,
            own_during=own,
            method="proc-stat",
            margin=self.margin,
            routes=routes_taken(),
        )


def read_ticks(root: int | None = None, exclude: set[int] = frozenset(), proc: Path = PROC):
    """A :class:`Ticks` reading of this machine and the process tree under ``root`` (default:
    this process), leaving out the subtrees of ``exclude``; None where ``/proc/stat`` cannot
    be read."""
    try:
        counts = parse_proc_stat((proc / "stat").read_text())
    except OSError:
        return None
    if counts is None:
        return None
    root = os.getpid() if root is None else root
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent, spent = parse_pid_stat((entry / "stat").read_text())
        except (OSError, IndexError, ValueError):  # it ended while being read
            continue
        parents[int(entry.name)], ticks[int(entry.name)] = parent, spent
    tree, todo = {}, [root]
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    while todo:
        pid = todo.pop()
        if pid in tree or pid in exclude or pid not in ticks:
            continue
        tree[pid] = ticks[pid]
        todo.extend(children.get(pid, ()))
    return Ticks(counts[0], counts[1], tree)


def routes_taken() -> dict[str, str]:
    """For each of clearformer's own kernels, what ``auto`` takes in this process and why
    (``"avx512 (AVX-512 attention: avx512 measured 1.12x torch's ...)"``): the switches and
    the measured verdicts (:func:`clearformer.routes.kernel_route`)."""
    from .. import switches
    from ..fast import avx512
    from ..routes import kernel_route

    taken = {kernel: str(kernel_route(kernel)) for kernel in avx512.KERNELS}
    taken["int8_steps"] = str(switches.kernel_setting("int8_steps"))
    return taken


def _cpu_summary() -> str:
    from ..cpu import cpu_info

    return cpu_info().summary()
