"""What ``index build`` and ``add`` say while they work (``commands/status_line.py``): progress
with its rate and the time left, redrawn in place on a terminal, a line every few seconds
elsewhere, and the phases' lines above it. A clock is passed in: no test waits."""

from __future__ import annotations

from clearformer.commands.status_line import StatusLine
from clearformer.text.progress import Throughput


def test_off_a_terminal_a_line_every_few_seconds_with_rate_and_time_left(capsys):
    now = [0.0]
    status = StatusLine("index build", redraw=False, clock=lambda: now[0])
    update = status.progress("embedding", "texts")
    for second, done in [(1, 100), (2, 200), (5.5, 550), (6, 600), (11, 1100), (12, 1200)]:
        now[0] = second
        update(done, 1200)
    assert capsys.readouterr().err.splitlines() == [
        "index build: embedding 550/1,200 texts, 100 texts/s, 0:06 left",
        "index build: embedding 1,100/1,200 texts, 100 texts/s, 0:01 left",
    ]


def test_on_a_terminal_one_line_redrawn_and_the_phases_above_it(capsys):
    now = [0.0]
    status = StatusLine("index build", redraw=True, clock=lambda: now[0])
    update = status.progress("inserting into the graph", "vectors")
    now[0] = 1
    update(10, 40)
    now[0] = 2
    update(20, 40)
    status.line("a phase")  # ends the drawn line first
    now[0] = 3
    update(40, 40)  # the last one is always drawn, and ends its line
    err = capsys.readouterr().err
    assert err.count("\r\033[K") == 3 and err.endswith("\n")
    lines = err.split("\n")
    assert lines[0].endswith("20/40 vectors, 10 vectors/s, 0:02 left")
    assert lines[1] == "index build: a phase"
    assert "[########################] inserting into the graph 40/40 vectors" in lines[2]


def test_the_rate_counts_only_the_items_done_since_the_first_report():
    # A resumed build reports 4,096 texts done at once (its committed chunks): not a rate.
    now = [0.0]
    meter = Throughput(lambda: now[0])
    assert meter.update(4096, 10_000) == (None, None)
    now[0] = 2
    rate, left = meter.update(4296, 10_000)
    assert (rate, left) == (100, 57.04)


def test_without_progress_a_library_is_given_nothing_to_call(capsys):
    status = StatusLine("index build", redraw=False, show_progress=False)
    assert status.progress("embedding", "texts") is None
    status.line("a phase")
    assert capsys.readouterr().err == "index build: a phase\n"
