"""FreeCpus: other processes' busy CPUs from tick counters (fake readings and clock here; the
real /proc once, against a busy child process)."""

import subprocess
import sys
import time

import pytest

from clearformer.free_cpus import MIN_INTERVAL, FreeCpus, parse_pid_stat, read_counters


class Fake:
    def __init__(self):
        self.now = 0.0
        self.counters = (0, 0, 0)  # machine busy, machine total, own

    def read(self):
        return self.counters

    def clock(self):
        return self.now


def test_others_is_the_machines_busy_time_less_our_own():
    fake = Fake()
    free = FreeCpus(2, read=fake.read, clock=fake.clock)
    assert free.others() == 0.0
    # Over 1 s on 2 CPUs (200 ticks): 150 busy, 40 of them ours -> others kept 1.1 CPUs busy.
    fake.now, fake.counters = 1.0, (150, 200, 40)
    assert free.others() == pytest.approx(1.1)
    assert free.threads_for(2, 2) == 1
    # Quiet again: 20 busy ticks, all ours.
    fake.now, fake.counters = 2.0, (170, 400, 60)
    assert free.others() == pytest.approx(0.0)
    assert free.threads_for(2, 2) == 2


def test_readings_closer_than_the_interval_keep_the_last_estimate():
    fake = Fake()
    free = FreeCpus(2, read=fake.read, clock=fake.clock)
    fake.now, fake.counters = 1.0, (200, 200, 0)
    assert free.others() == pytest.approx(2.0)
    fake.now, fake.counters = 1.0 + MIN_INTERVAL / 2, (200, 210, 10)
    assert free.others() == pytest.approx(2.0)


@pytest.mark.parametrize(
    ("others", "wanted", "of", "expected"),
    [
        (0.0, 8, 8, 8),
        (4.0, 8, 8, 4),
        (4.0, 4, 8, 2),  # a worker's share shrinks with the machine's free part
        (7.9, 8, 8, 1),  # never below one thread
        (0.0, 1, 2, 1),
        (0.5, 2, 2, 2),  # half a CPU busy (a client's bursts, say): still both
        (0.75, 2, 2, 2),
        (0.8, 2, 2, 1),  # most of a CPU busy: not counted
        (1.0, 2, 2, 1),
    ],
)
def test_threads_for_counts_a_cpu_at_least_a_quarter_free(others, wanted, of, expected):
    free = FreeCpus(of, read=lambda: None)
    free._others = others
    assert free.threads_for(wanted, of) == expected


def test_unreadable_counters_leave_every_cpu_free():
    free = FreeCpus(4, read=lambda: None, clock=lambda: 10.0)
    assert free.others() == 0.0
    assert free.threads_for(4, 4) == 4


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_busy_child_process_is_counted_as_others():
    assert read_counters() is not None
    free = FreeCpus()
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(1.0)
        with open(f"/proc/{spin.pid}/stat") as stat:
            before = parse_pid_stat(stat.read())[1]
        others = free.others()
    finally:
        spin.kill()
        spin.wait()
    assert before > 0
    # The child alone kept most of a CPU busy; whatever else ran can only add to it.
    assert others >= 0.5
