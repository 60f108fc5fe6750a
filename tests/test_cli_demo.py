"""The CLI entry point and its demo command."""

from __future__ import annotations

from clearformer.cli import main


def test_demo_runs_and_reports_agreement(capsys):
    assert main(["demo", "--d-model", "32", "--n-heads", "4"]) == 0
    out = capsys.readouterr().out
    assert "padded positions are zero: True" in out
    worst = float(out.split("max |difference| = ")[1].split()[0])
    assert worst < 1e-5


def test_no_command_prints_help_and_fails(capsys):
    assert main([]) == 2
    assert "usage" in capsys.readouterr().out


def test_bad_option_is_one_line_without_traceback(capsys):
    assert main(["demo", "--n-heads", "5", "--d-model", "32"]) == 2
    err = capsys.readouterr().err
    assert "divisible" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_layer_count_that_would_take_minutes_is_refused(capsys):
    assert main(["demo", "--n-layers", "2000", "--d-model", "8", "--n-heads", "1"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "clearformer demo: error: --n-layers must be at most 256, got 2000"
