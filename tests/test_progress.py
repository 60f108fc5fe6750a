"""Long work's progress (clearformer.progress): a wait read as a person reads it, the pace and
the time left from the count so far, and the records of one logger that only the command line
shows by default."""

from __future__ import annotations

import logging

from clearformer import progress


def test_a_wait_reads_in_the_largest_units_it_needs():
    assert progress.duration(7.6) == "8 s"
    assert progress.duration(125) == "2 min 05 s"
    assert progress.duration(3725) == "1 h 02 min"
    assert progress.duration(-1) == "0 s"


def test_the_pace_and_the_time_left_follow_from_the_count_so_far():
    assert progress.pace(10, 1500, 4.0, "steps") == "2.5 steps/s, ETA 9 min 56 s"
    assert progress.pace(1500, 1500, 600.0, "steps") == "2.5 steps/s"  # done: nothing left
    assert progress.pace(4000, 5000, 2.0, "texts") == "2,000 texts/s, ETA 0 s"
    assert progress.pace(0, 10, 1.0, "steps") == ""  # no pace before the first one


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_meter_logs_how_far_it_is_on_the_progress_logger(caplog):
    clock = Clock()
    meter = progress.Meter("calibrating", 8, "workloads", clock=clock)
    assert meter.line(0) == "calibrating: 0/8 workloads"
    clock.now += 4.0
    with caplog.at_level(logging.INFO, logger=progress.LOGGER_NAME):
        meter.report(2)
        progress.phase("loading the model")
    assert [(r.name, r.getMessage()) for r in caplog.records] == [
        (progress.LOGGER_NAME, "calibrating: 2/8 workloads, 0.5 workloads/s, ETA 12 s"),
        (progress.LOGGER_NAME, "loading the model..."),
    ]


def test_a_program_sees_no_progress_unless_it_asks(capsys):
    # No handler, no level: the records stay below logging's last-resort WARNING.
    progress.phase("quiet")
    assert capsys.readouterr().err == ""
