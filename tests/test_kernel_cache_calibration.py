"""The kernels' calibration and its cache (clearformer.calibration.kernels.calibrate): a cache
folder that cannot keep the verdicts costs a warning, not the calibration (``clearformer
serve`` and a training run start on them); a verdict measured while other processes were busy
is used and measured again by the next process; two processes calibrating take turns, and the
one that waited reads what the other measured. The workloads are trivial and the load meter
is told what it found: nothing here times real work."""

from __future__ import annotations

import dataclasses
import fcntl
import logging
import threading
from types import SimpleNamespace

import pytest

from clearformer import kernel_routes, routes
from clearformer.bench import load as bench_load
from clearformer.calibration import cache, kernels
from clearformer.calibration.measure import Workload
from clearformer.fast import avx512
from clearformer.machine import machine
from clearformer.options import Decision

from .helpers import watch_lock_waits
from .test_calibration import verdict_of


class Calibrating:
    """What the calibration ran, and what the load meter reports."""

    def __init__(self) -> None:
        self.runs = 0
        self.busy = False  # other processes were busy while it measured

    def workloads(self, *names: str) -> list[Workload]:
        def run():
            self.runs += 1

        return [Workload(name, {"torch": run, "avx512": run}) for name in names]

    def meter(self, **_):
        def record():
            return SimpleNamespace(
                loaded=self.busy,
                cpu="Test CPU",
                others_during=1.5 if self.busy else 0.0,
                reason="others busy (a test)" if self.busy else "quiet (a test)",
            )

        return SimpleNamespace(start=lambda: SimpleNamespace(record=record))

    def verdicts(self, busy: bool) -> dict:
        """A verdict for every kernel this CPU measures, as a process found them."""
        verdict = verdict_of([{"torch": 0.02, "avx512": 0.01}])
        context = {"loaded": busy, "load": "a test"}
        return {
            kernel: dataclasses.replace(verdict, choice=kernel, context=context)
            for kernel in avx512.kernels_here()
        }


@pytest.fixture
def calibrating(tmp_path, monkeypatch) -> Calibrating:
    """``calibrate`` with the library as loaded, ``auto`` left to the verdicts, a cache of its
    own in ``tmp_path / "cache"``."""
    fake = Calibrating()
    for variable in ("CLEARFORMER_AVX512", "CLEARFORMER_CALIBRATION", "CLEARFORMER_KERNELS"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("CLEARFORMER_CACHE", str(tmp_path / "cache"))
    able = dataclasses.replace(machine(), avx512=Decision("available", "a test's machine"))
    for module in (avx512, kernel_routes, kernels):
        monkeypatch.setattr(module, "machine", lambda: able)
    monkeypatch.setattr(avx512, "_state", {})
    monkeypatch.setattr(avx512, "load", lambda build=True: Decision("loaded", "a test"))
    monkeypatch.setattr(kernels, "attention_workloads", lambda dtype=None: fake.workloads("a"))
    monkeypatch.setattr(kernels, "linear_workloads", lambda few_rows=(): fake.workloads("b"))
    monkeypatch.setattr(kernels, "flash_workloads", lambda dtype: fake.workloads("c"))
    monkeypatch.setattr(kernels, "dropout_workloads", lambda: fake.workloads("d"))
    monkeypatch.setattr(bench_load, "LoadMeter", fake.meter)
    cache.forget()
    yield fake
    cache.forget()


def test_a_cache_that_cannot_be_written_costs_a_warning_not_the_calibration(
    calibrating, tmp_path, monkeypatch, caplog
):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("CLEARFORMER_CACHE", str(blocker / "cache"))  # no folder can be made
    with caplog.at_level(logging.WARNING, logger="clearformer.calibration"):
        result = kernels.calibrate()
    assert result.measured and result.path is None
    assert set(result.verdicts) == set(avx512.kernels_here())
    said = [r.getMessage() for r in caplog.records if r.name.endswith("kernels")]
    assert len(said) == 1 and "could not be cached" in said[0]
    # This process uses what it measured: no second measurement, and auto reads them.
    runs = calibrating.runs
    assert not routes.verdicts_wanted()
    assert kernels.measure_before_serving() is None
    again = kernels.calibrate()
    assert not again.measured and again.verdicts == result.verdicts
    assert calibrating.runs == runs
    taken = kernel_routes.kernel_route("avx512_attention").reason
    assert "avx512 measured" in taken and "not cached" in taken


def test_a_verdict_measured_on_a_busy_machine_is_measured_again_at_the_next_start(
    calibrating, monkeypatch
):
    def next_process():
        monkeypatch.setattr(cache, "_measured", set())  # it has measured nothing yet
        cache.forget()

    cache.write(avx512.calibration_key(), calibrating.verdicts(busy=True))
    next_process()
    assert routes.verdicts_wanted()  # provisional: measured again
    calibrating.busy = True  # and busy again
    assert kernels.calibrate().measured
    runs = calibrating.runs
    assert runs > 0
    # Used, and not measured again by the same process.
    assert not routes.verdicts_wanted()
    assert not kernels.calibrate().measured and calibrating.runs == runs
    # The next process measures it again; one measured on a quiet machine stays.
    next_process()
    assert routes.verdicts_wanted()
    calibrating.busy = False
    assert kernels.calibrate().measured
    next_process()
    assert not routes.verdicts_wanted()
    assert not kernels.calibrate().measured


@pytest.mark.parametrize("busy", [False, True])
def test_a_calibration_waits_for_another_and_reads_what_it_measured(calibrating, monkeypatch, busy):
    # The test plays the other process: it holds calibration/.lock, writes its verdicts, lets
    # go. What it measured is taken even where provisional: measured just now, not again.
    waiting, flock = watch_lock_waits(monkeypatch)
    folder = cache.cache_folder() / "calibration"
    folder.mkdir(parents=True)
    results = []
    with open(folder / ".lock", "a") as lock:
        flock(lock.fileno(), fcntl.LOCK_EX)
        measuring = threading.Thread(target=lambda: results.append(kernels.calibrate()))
        measuring.start()
        while not waiting.is_set() and measuring.is_alive():
            waiting.wait(0.05)
        assert waiting.is_set(), "calibrate measured without waiting for the lock"
        theirs = calibrating.verdicts(busy=busy)
        cache.write(avx512.calibration_key(), theirs)
    measuring.join(timeout=300)
    assert not measuring.is_alive()
    (result,) = results
    assert not result.measured and result.reason == "cached" and result.verdicts == theirs
    assert not routes.verdicts_wanted()
    assert calibrating.runs == 0
