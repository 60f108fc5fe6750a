"""How busy the machine was: a benchmark taken while other processes ran is flagged.

On a shared machine other processes slow every implementation, but not equally: torch.nn's
nested-tensor path slows 2-4x under load, clearformer's packed path much less, so a loaded run
flatters clearformer (docs/performance.md). Every result therefore records the load average
before and after it, and says whether it was quiet. Process CPU time per call, recorded beside
wall time, is the cross-check that load distorts less: it counts the work done, not the waits.
The record also names the CPU (:mod:`clearformer.cpu`): figures from two machines do not
compare.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

# A quiet machine's 1-minute load average before a run (no other process busy).
QUIET_BEFORE = 0.5
# After a run the load counts the benchmark's own threads; beyond them, this much is others'.
QUIET_MARGIN = 0.5


@dataclass(frozen=True)
class LoadRecord:
    """The load averages (1, 5, 15 minutes) before and after a run, and the verdict."""

    before: tuple[float, float, float]
    after: tuple[float, float, float]
    threads: int
    cores: int
    loaded: bool
    reason: str
    cpu: str = ""  # clearformer.cpu.CpuInfo.summary() of the machine that ran it

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        state = "LOADED" if self.loaded else "quiet"
        return (
            f"{state}: load average {self.before[0]:.2f} before, {self.after[0]:.2f} after "
            f"({self.threads} benchmark threads, {self.cores} cores); {self.reason}"
            + (f". CPU: {self.cpu}" if self.cpu else "")
        )


def load_average() -> tuple[float, float, float]:
    try:
        return os.getloadavg()
    except OSError:  # a platform without it: unknown counts as not quiet
        return (float("nan"),) * 3


def judge(
    before: tuple[float, float, float], after: tuple[float, float, float], threads: int
) -> LoadRecord:
    """Whether a run between the two load readings was quiet, and why not."""
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
    from ..cpu import cpu_info

    return LoadRecord(
        tuple(before), tuple(after), threads, cores, loaded, reason, cpu_info().summary()
    )
