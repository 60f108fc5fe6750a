"""Benchmarks flag a run taken while other processes were busy, and time CPU work beside
wall time."""

from __future__ import annotations

import math
import time

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


def test_cpu_time_counts_work_not_waiting():
    def busy():
        end = time.process_time() + 0.02
        while time.process_time() < end:
            pass

    times = interleaved({"sleep": lambda: time.sleep(0.02), "busy": busy}, warmup=0, repeats=2)
    assert all(t >= 0.02 for t in times["sleep"]) and all(t < 0.01 for t in times.cpu["sleep"])
    assert all(c >= 0.02 for c in times.cpu["busy"])


def test_every_load_record_names_the_cpu():
    from clearformer.cpu import cpu_info

    record = judge((0.1, 0.2, 0.3), (2.2, 1.0, 0.5), threads=2)
    assert record.cpu == cpu_info().summary() and record.to_dict()["cpu"] == record.cpu
    assert record.describe().endswith(f"CPU: {record.cpu}")
