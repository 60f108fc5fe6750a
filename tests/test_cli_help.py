"""What the parser tells a newcomer: a mistyped option is reported by its own command with the
closest option it has, every option that takes a value names its default in ``--help``, and
the top-level help lists every training task."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from clearformer.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]


def _parse_error(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as stopped:
        main(list(argv))
    assert stopped.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    return captured.err


def test_a_mistyped_option_gets_its_commands_usage_and_the_closest_option(capsys):
    err = _parse_error(capsys, "train", "--lrr", "0.1")
    assert err.startswith("usage: clearformer train ")  # the command's usage, not the top's
    assert err.splitlines()[-1] == (
        "clearformer train: error: unrecognized arguments: --lrr 0.1 (did you mean --lr?)"
    )


def test_each_mistyped_option_is_named_with_its_guess(capsys):
    err = _parse_error(capsys, "encode", "x", "--workres", "2", "--bach-size=3")
    assert err.startswith("usage: clearformer encode ")
    assert err.splitlines()[-1].endswith(
        "(did you mean --workers for --workres, --batch-size for --bach-size?)"
    )


def test_a_stray_word_is_named_without_a_guess(capsys):
    err = _parse_error(capsys, "rerank", "query", "extra", "--corpus", "f", "--model", "d")
    assert err.splitlines()[-1] == "clearformer rerank: error: unrecognized arguments: extra"


def _parsers(parser: argparse.ArgumentParser, name: str = "clearformer"):
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command, sub in action.choices.items():
                yield from _parsers(sub, f"{name} {command}")


def test_every_option_that_takes_a_value_names_its_default():
    missing = []
    for name, parser in _parsers(build_parser()):
        formatter = parser._get_formatter()
        for action in parser._actions:
            if (
                not action.option_strings
                or action.nargs == 0  # a switch
                or action.default is None
                or action.default is argparse.SUPPRESS
                or action.help is argparse.SUPPRESS
            ):
                continue
            shown = formatter._expand_help(action) if action.help is not None else ""
            if "default" not in shown:
                missing.append(f"{name} {action.option_strings[-1]}: {shown!r}")
    assert missing == []


def test_every_help_is_text_a_person_can_read():
    # argparse formats each help with "%": a stray "%" in a help built from a comment ("30%
    # slower") printed the whole action's dict into --help.
    for name, parser in _parsers(build_parser()):
        shown = parser.format_help()
        assert "option_strings" not in shown, name
    train = dict(_parsers(build_parser()))["clearformer train"].format_help()
    assert "30% slower" in " ".join(train.split())


def test_the_search_and_rerank_help_names_how_many_results(capsys):
    for command in ("search", "rerank"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        help_text = " ".join(capsys.readouterr().out.split())
        assert re.search(r"--top-k \w+ [^-]*\(default 5\)", help_text), command


def test_the_top_level_help_lists_every_training_task(capsys):
    from clearformer.train.config import TASKS

    with pytest.raises(SystemExit) as stopped:
        main(["--help"])
    assert stopped.value.code == 0
    listing = " ".join(capsys.readouterr().out.split())  # the help wraps long entries
    train_entry = listing.split(" train ", 1)[1].split(" generate ", 1)[0]
    assert [task for task in TASKS if task not in train_entry] == []


def test_run_folders_are_not_offered_to_git():
    # `clearformer train --out runs/digits`, as the README runs it, in a clone.
    assert "runs/" in (ROOT / ".gitignore").read_text().splitlines()
