"""``clearformer train`` says what it does from its first moment: the run it starts, each slow
step of the set-up as it begins, then each training line with the pace and the time left."""

from __future__ import annotations

import pytest

from clearformer.cli import main

from .train_helpers import tiny_flags

pytest.importorskip("sklearn")  # the digits task's images


def _run(capsys, out, *extra: str) -> list[str]:
    flags = tiny_flags(steps=10, log_every=5, eval_every=10, checkpoint_every=10)
    assert main(["train", *flags, "--out", str(out), *extra]) == 0
    return capsys.readouterr().err.splitlines()


def test_each_phase_is_said_as_it_begins_and_steps_show_pace_and_time_left(capsys, tmp_path):
    run = tmp_path / "run"
    lines = _run(capsys, run)
    assert lines[:3] == [
        f"clearformer train: the digits task, 10 steps, into {run}",
        "clearformer train: loading the digits task's data...",
        "clearformer train: building the model...",
    ]
    assert lines[3].startswith("clearformer train: training ")
    assert lines[3].endswith(" parameters from step 0 to 10, a line every 5 steps")
    steps = [line for line in lines if line.startswith("step ")]
    assert len(steps) == 2
    assert all(" steps/s" in line for line in steps)
    assert ", ETA " in steps[0] and "ETA" not in steps[1]  # nothing is left after the last


def test_quiet_says_only_how_the_run_ended(capsys, tmp_path):
    lines = _run(capsys, tmp_path / "run", "-q")
    assert len(lines) == 1 and lines[0].startswith("clearformer train: finished at step 10")
