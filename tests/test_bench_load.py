"""Benchmarks flag a run taken while other processes were busy, and time CPU work beside
wall time (checked with the test's own clocks)."""

from __future__ import annotations

import math
import types

import pytest

from clearformer.bench import timing
from clearformer.bench.load import judge
from clearformer.bench.timing import interleaved


def test_a_quiet_run_and_the_two_kinds_of_load():
    quiet = judge((0.1, 0.2, 0.3), (2.2, 1.0, 0.5), threads=2)
    assert not quiet.loaded and "quiet" in quiet.describe()
    busy_before = judge((1.4, 1.0, 0.5), (2.0, 1.0, 0.5), threads=2)
    assert busy_before.loaded and "before the run" in busy_before.reason
    rose = judge((0.2, 0.2, 0.2), (3.1, 1.0, 0.5), threads=2)
    assert rose.loaded and "rose above" in rose.reason
    unknown = judge((math.nan,) * 3, (math.nan,) * 3, threads=2)
    assert unknown.loaded and "LOADED" in unknown.describe()


def test_cpu_time_counts_work_not_waiting(monkeypatch):
    """``interleaved`` reads the wall clock and the process CPU clock around each call: a call
    that waits adds wall time only, one that works adds both. The clocks are the test's own,
    moved by each call by a set amount, so the test checks the bookkeeping and not how busy
    the machine was (two calls that really slept and worked gave CPU times that other
    threads of the process could push over the limit)."""
    clock = {"wall": 0.0, "cpu": 0.0}
    fake_time = types.SimpleNamespace(
        perf_counter=lambda: clock["wall"], process_time=lambda: clock["cpu"]
    )
    monkeypatch.setattr(timing, "time", fake_time)
    calls = []

    def sleep():
        calls.append("sleep")
        clock["wall"] += 0.02

    def busy():
        calls.append("busy")
        clock["wall"] += 0.03
        clock["cpu"] += 0.03

    times = interleaved({"sleep": sleep, "busy": busy}, warmup=1, repeats=3)
    assert times["sleep"] == pytest.approx([0.02] * 3) and times.cpu["sleep"] == [0.0] * 3
    assert times["busy"] == pytest.approx([0.03] * 3)
    assert times.cpu["busy"] == pytest.approx([0.03] * 3)
    # one warm-up round, then rounds that take turns at going first
    assert calls == ["sleep", "busy", "sleep", "busy", "busy", "sleep", "sleep", "busy"]


def test_every_load_record_names_the_cpu():
    from clearformer.cpu import cpu_info

    record = judge((0.1, 0.2, 0.3), (2.2, 1.0, 0.5), threads=2)
    assert record.cpu == cpu_info().summary() and record.to_dict()["cpu"] == record.cpu
    assert record.describe().endswith(f"CPU: {record.cpu}")
