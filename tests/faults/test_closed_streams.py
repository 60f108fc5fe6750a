"""A closed stdin, stdout or stderr (``0<&-``, ``>&-``, ``2>&-`` in a shell) gives one error
line naming the stream, or no problem where the command does not need it; never a
traceback. Real subprocesses: the descriptor is closed before the interpreter starts."""

from __future__ import annotations

import json
import os

import numpy as np

from .conftest import run_cli


def _closing(*fds: int):
    def close() -> None:
        for fd in fds:
            os.close(fd)

    return close


def test_closed_stdin_is_named(tiny_checkpoint):
    done = run_cli("encode", "--model", str(tiny_checkpoint), preexec_fn=_closing(0))
    assert done.returncode == 2, done.stderr
    assert "error: no input texts: stdin is closed" in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_closed_stdout_is_refused_before_the_work(tiny_checkpoint):
    done = run_cli(
        "encode", "--model", str(tiny_checkpoint), "a cat", stdout=None, preexec_fn=_closing(1)
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "clearformer encode: error: stdout is closed, and this command writes its results "
        "there; give --output FILE"
    ]


def test_closed_stdout_is_fine_with_an_output_file(tiny_checkpoint, tmp_path):
    target = tmp_path / "out.npy"
    done = run_cli(
        "encode",
        "--model",
        str(tiny_checkpoint),
        "a cat",
        "-o",
        str(target),
        stdout=None,
        preexec_fn=_closing(1),
    )
    assert done.returncode == 0, done.stderr
    assert np.load(target).shape == (1, 16)


def test_closed_stderr_keeps_messages_out_of_stdout(tiny_checkpoint, tmp_path):
    """With fd 2 closed, print(file=sys.stderr) would write to stdout: stdout must hold only
    the JSONL results."""
    done = run_cli(
        "encode", "--model", str(tiny_checkpoint), "a cat", stderr=None, preexec_fn=_closing(2)
    )
    assert done.returncode == 0
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["text"] for r in rows] == ["a cat"]
    failed = run_cli("encode", "x", "-o", str(tmp_path / "out.csv"), preexec_fn=_closing(2))
    assert failed.returncode == 2 and failed.stdout == ""


def test_help_with_closed_stdout(tiny_checkpoint):
    done = run_cli("--help", stdout=None, preexec_fn=_closing(1))
    assert done.returncode == 0 and "Traceback" not in done.stderr
    search = run_cli("search", "q", "--corpus", __file__, stdout=None, preexec_fn=_closing(1))
    assert search.returncode == 2 and "stdout is closed" in search.stderr
