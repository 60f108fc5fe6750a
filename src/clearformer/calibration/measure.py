"""A named choice between candidate callables, settled by timing them on this machine.

A route that is faster on one CPU can be slower on another: clearformer's AVX-512 attention
beat PyTorch's flash kernel on an AMD EPYC and lost in whole ``encode`` calls on an Intel Xeon
with AMX. A vendor or instruction-set rule cannot know which; a measurement on the CPU at hand
can. :func:`measure_choice` times every candidate on each of a few representative workloads,
alternating between them so that a slow phase of the machine is charged to all alike, and
names the winner only where it is decisively faster than the baseline (PyTorch's route): a
tie, or a loss, keeps the baseline.

Nothing here knows about kernels: a candidate is a callable that runs one call of a
workload. :mod:`clearformer.calibration.kernels` builds the AVX-512 kernels' workloads; a
precision choice (float32 or bf16) can build its own and share this code.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

log = logging.getLogger(__name__)

# A candidate must be this much faster than the baseline (geometric mean over the workloads)
# to be taken: two equal routes measured on a shared machine differ by a few percent either
# way, and a route that is only as fast is not worth its rounding differences and its build.
MARGIN = 0.05
ROUNDS = 5  # timed rounds per workload, each candidate once per round; medians compared
MIN_SAMPLE_SECONDS = 0.005  # a sample repeats its call until it lasts this long (timer noise)
MAX_REPEATS = 64


@dataclass(frozen=True)
class Workload:
    """One representative call, ``runs`` mapping each candidate's name to a callable that
    makes that call once its way (every candidate must compute the same thing)."""

    name: str
    runs: Mapping[str, Callable[[], object]]


@dataclass(frozen=True)
class Verdict:
    """The outcome of one measured choice.

    Attributes:
        choice: what was chosen between (``avx512_attention``).
        baseline: the candidate kept unless another is decisively faster (``torch``).
        winner: the candidate taken.
        speedups: each candidate's geometric-mean speed over the baseline's (baseline time /
            candidate time; above 1: faster). The baseline's is 1.
        seconds: per workload, each candidate's median seconds per call.
        margin: how much faster than the baseline a winner had to be.
        rounds: timed rounds per workload.
        reason: one line, for logs and a plan's printout.
        context: what else the caller recorded (threads, load, the CPU).
    """

    choice: str
    baseline: str
    winner: str
    speedups: dict[str, float]
    seconds: dict[str, dict[str, float]]
    margin: float
    rounds: int
    reason: str
    context: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> Verdict:
        """The verdict :meth:`to_dict` wrote; raises ValueError naming a missing or mistyped
        field (a damaged cache file)."""
        kinds = {
            "choice": str,
            "baseline": str,
            "winner": str,
            "speedups": dict,
            "seconds": dict,
            "margin": (int, float),
            "rounds": int,
            "reason": str,
        }
        for name, kind in kinds.items():
            value = data.get(name)
            # bool is an int to isinstance: true is no margin or count of rounds.
            if not isinstance(value, kind) or isinstance(value, bool):
                raise ValueError(f"verdict field {name!r}: expected {kind}, got {value!r}")
        # The readers compute with these (a speedup compared, printed with :.2f): a string
        # there would raise TypeError far from the file that holds it.
        for candidate, speedup in data["speedups"].items():
            _check_number(f"speedups[{candidate!r}]", speedup)
        for workload, times in data["seconds"].items():
            if not isinstance(times, dict) or set(times) != set(data["speedups"]):
                raise ValueError(
                    f"verdict field seconds[{workload!r}]: expected a time for each of "
                    f"{sorted(data['speedups'])}, got {times!r}"
                )
            for candidate, seconds in times.items():
                _check_number(f"seconds[{workload!r}][{candidate!r}]", seconds)
        _check_number("margin", data["margin"])
        for role in ("winner", "baseline"):
            if data[role] not in data["speedups"]:
                raise ValueError(f"verdict {role} {data[role]!r} has no speedup")
        return cls(**{name: data[name] for name in kinds}, context=dict(data.get("context", {})))

    def speedup(self, candidate: str | None = None) -> float:
        """``candidate``'s (default: the best non-baseline candidate's) speed over the
        baseline's."""
        if candidate is None:
            others = {n: s for n, s in self.speedups.items() if n != self.baseline}
            candidate = max(others, key=others.get) if others else self.baseline
        return self.speedups[candidate]


def _check_number(field: str, value: object) -> None:
    """Raise ValueError unless ``value`` is a finite real number (bool is not one)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"verdict field {field}: expected a finite number, got {value!r}")


def measure_choice(
    choice: str,
    workloads: Sequence[Workload],
    *,
    baseline: str,
    rounds: int = ROUNDS,
    margin: float = MARGIN,
    clock: Callable[[], float] = time.perf_counter,
    context: Mapping | None = None,
    on_workload: Callable[[Workload], None] | None = None,
) -> Verdict:
    """Time every candidate of every workload and name the winner.

    Each workload's candidates run once untimed (a first call builds caches and packs
    weights), then ``rounds`` times each, alternating, the order reversed every other round;
    a sample repeats the call until it lasts ``MIN_SAMPLE_SECONDS``. A candidate's speedup is
    the geometric mean over the workloads of the baseline's median over its own. The winner
    is the fastest candidate whose speedup reaches ``1 + margin``; the baseline otherwise.
    ``clock`` is injectable so that tests decide the outcome without wall time;
    ``on_workload`` is called after each workload is timed (a caller's progress).
    """
    if not workloads:
        raise ValueError(f"{choice}: measure_choice needs at least one workload")
    if rounds < 1:
        raise ValueError(f"rounds: expected at least 1, got {rounds}")
    names = list(workloads[0].runs)
    if baseline not in names or len(names) < 2:
        raise ValueError(
            f"{choice}: expected a baseline {baseline!r} among two or more candidates, got {names}"
        )
    for workload in workloads:
        if list(workload.runs) != names:
            raise ValueError(
                f"{choice}: workload {workload.name!r} has candidates {list(workload.runs)}, "
                f"expected {names}"
            )
    seconds = {}
    for workload in workloads:
        seconds[workload.name] = _time_workload(workload, names, rounds, clock)
        if on_workload is not None:
            on_workload(workload)
    speedups = {
        name: _geometric_mean([seconds[w][baseline] / seconds[w][name] for w in seconds])
        for name in names
    }
    contenders = {n: s for n, s in speedups.items() if n != baseline and s >= 1 + margin}
    winner = max(contenders, key=contenders.get) if contenders else baseline
    best_other = max((n for n in names if n != baseline), key=speedups.get)
    if winner != baseline:
        reason = f"{winner} measured {speedups[winner]:.2f}x {baseline}'s"
    elif speedups[best_other] >= 1:
        reason = (
            f"{best_other} measured {speedups[best_other]:.2f}x {baseline}'s, within the "
            f"{margin:.0%} margin: {baseline} kept"
        )
    else:
        reason = f"{best_other} measured slower: {speedups[best_other]:.2f}x {baseline}'s"
    verdict = Verdict(
        choice, baseline, winner, speedups, seconds, margin, rounds, reason, dict(context or {})
    )
    log.info("calibration %s: %s", choice, reason)
    return verdict


def _time_workload(
    workload: Workload, names: list[str], rounds: int, clock: Callable[[], float]
) -> dict[str, float]:
    """Median seconds per call of each candidate on one workload."""
    repeats = {}
    for name in names:  # untimed first call, which also sizes the samples
        started = clock()
        workload.runs[name]()
        once = max(clock() - started, 1e-9)
        repeats[name] = max(1, min(MAX_REPEATS, math.ceil(MIN_SAMPLE_SECONDS / once)))
    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(rounds):
        order = names if round_ % 2 == 0 else names[::-1]  # no candidate always goes first
        for name in order:
            run, count = workload.runs[name], repeats[name]
            started = clock()
            for _ in range(count):
                run()
            samples[name].append((clock() - started) / count)
    medians = {name: statistics.median(times) for name, times in samples.items()}
    log.debug("calibration workload %s: %s", workload.name, medians)
    return medians


def _geometric_mean(ratios: list[float]) -> float:
    return math.exp(sum(math.log(max(r, 1e-12)) for r in ratios) / len(ratios))
