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


def test_every_load_record_names_the_cpu_and_the_routes_of_clearformers_kernels():
    from clearformer.cpu import cpu_info

    record = judge((0.1, 0.2, 0.3), (2.2, 1.0, 0.5), threads=2)
    assert record.cpu == cpu_info().summary() and record.to_dict()["cpu"] == record.cpu
    assert f". CPU: {record.cpu}. Routes: " in record.describe()
    # the suite runs with CLEARFORMER_AVX512=off (conftest): PyTorch's routes, saying why
    assert record.routes["avx512_attention"].startswith("torch (")
    assert set(record.to_dict()["routes"]) == {
        "avx512_attention",
        "avx512_attention_bf16",
        "avx512_linear",
        "avx512_linear_rows",
        "avx512_flash",
        "avx512_flash_bf16",
        "avx512_dropout",
        "int8_steps",
    }


# Direct accounting (LoadMeter): fake tick readings, so that the verdict logic is checked
# without depending on how busy the machine running the suite is.


def meter_of(readings, cpus=2, probe=1.0, margin=0.25):
    """A LoadMeter that reads ``readings`` (Ticks) in turn and sleeps no time."""
    from clearformer.bench.load import LoadMeter

    queue = list(readings)
    return LoadMeter(
        threads=2,
        probe_seconds=probe,
        margin=margin,
        read=lambda: queue.pop(0),
        sleep=lambda s: None,
        cpus=cpus,
    )


def ticks(busy, total, **tree):
    from clearformer.bench.load import Ticks

    return Ticks(busy, total, {int(pid[1:]): t for pid, t in tree.items()})


def test_a_quiet_machine_is_quiet():
    # 2 CPUs, 100 ticks each per second: the probe (1 s) sees 2 busy ticks of 200, the run
    # (2 s) 4 of 400 beyond its own
    record = (
        meter_of([ticks(1000, 10000, p1=50), ticks(1002, 10200, p1=50), ticks(1006, 10600, p1=50)])
        .start()
        .record()
    )
    assert not record.loaded and record.method == "proc-stat"
    assert record.others_before == pytest.approx(0.02) and record.others_during == pytest.approx(
        0.02
    )
    assert "quiet" in record.describe() and "within the 0.25-CPU margin" in record.reason


def test_the_runs_own_threads_do_not_count():
    # both CPUs fully busy during the run, all of it this process's own threads
    record = (
        meter_of([ticks(0, 0, p1=0), ticks(0, 200, p1=0), ticks(400, 600, p1=400)]).start().record()
    )
    assert not record.loaded and record.own_during == pytest.approx(2.0)
    assert record.others_during == pytest.approx(0.0)


def test_other_processes_busy_during_the_run_make_it_loaded():
    # the run keeps one CPU busy, someone else the other
    record = (
        meter_of([ticks(0, 0, p1=0), ticks(0, 200, p1=0), ticks(400, 600, p1=200)]).start().record()
    )
    assert record.loaded and record.others_during == pytest.approx(1.0)
    assert "1.00 CPUs during the run" in record.reason and "LOADED" in record.describe()


def test_other_processes_busy_before_the_run_make_it_loaded():
    # a process still running while the idle probe sleeps: half a CPU
    record = (
        meter_of([ticks(0, 0, p1=0), ticks(100, 400, p1=0), ticks(100, 800, p1=0)], probe=2.0)
        .start()
        .record()
    )
    assert record.loaded and record.others_before == pytest.approx(0.5)
    assert "0.50 CPUs before" in record.reason


def test_a_child_process_counts_as_the_runs_own_until_it_is_reaped():
    # a server child (pid 2) busy on one CPU, then reaped: its time moves into its parent's
    # count of reaped children, and is counted once
    readings = [
        ticks(0, 0, p1=10, p2=30),
        ticks(0, 200, p1=10, p2=30),
        ticks(200, 400, p1=10, p2=230),
    ]
    assert not meter_of(readings).start().record().loaded
    reaped = [
        ticks(0, 0, p1=10, p2=30),
        ticks(0, 200, p1=10, p2=30),
        ticks(200, 400, p1=10 + 230),
    ]  # p1's count holds p2's whole 230 ticks now
    record = meter_of(reaped).start().record()
    assert not record.loaded and record.own_during == pytest.approx(2.0)


def test_without_proc_stat_the_load_average_decides():
    from clearformer.bench.load import LoadMeter

    record = LoadMeter(threads=2, read=lambda: None, sleep=lambda s: None).start().record()
    assert record.method == "load average" and record.others_during is None


def test_proc_files_are_parsed_and_the_tree_followed(tmp_path):
    from clearformer.bench.load import parse_pid_stat, parse_proc_stat, read_ticks

    stat = "cpu  100 5 20 1000 7 1 2 3 0 0\ncpu0 50 2 10 500 3 0 1 1 0 0\n"
    assert parse_proc_stat(stat) == (100 + 5 + 20 + 1 + 2 + 3, 131 + 1000 + 7)
    # a command name with a space and a parenthesis
    line = "42 (a (b) c) S 7 42 42 0 -1 4194304 1 0 0 0 11 12 13 14 20 0 1 0 5 0 0"
    assert parse_pid_stat(line) == (7, 11 + 12 + 13 + 14)
    (tmp_path / "stat").write_text(stat)
    for pid, parent, spent in [(10, 1, 5), (11, 10, 6), (12, 11, 7), (13, 1, 100), (14, 10, 9)]:
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(
            f"{pid} (p) S {parent} 0 0 0 0 0 0 0 0 0 {spent} 0 0 0 20 0 1 0 5 0 0"
        )
    reading = read_ticks(root=10, exclude={14}, proc=tmp_path)
    assert reading.tree == {10: 5, 11: 6, 12: 7}  # 13 is not ours; 14 is load on purpose
    assert read_ticks(proc=tmp_path / "missing") is None
