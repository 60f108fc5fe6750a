"""SIGTERM while an output is being written stops the command like Ctrl-C does: the hidden
temporary file is removed, an earlier output is kept as it was, the exit status says which
signal (143 for SIGTERM, 130 for SIGINT). A real subprocess gets a real signal, at a moment
made certain: the JSONL writer is slowed to wait inside the atomic write."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from .conftest import cli_env

# Runs the CLI with the writer of a .jsonl file stopped half-way, until a signal comes.
SLOW_WRITER = """
import sys, time
from clearformer.commands import encode

def half_written(handle, texts, embeddings):
    handle.write('{"index": 0, "embedding": [0.1')
    handle.flush()
    print("WRITING", file=sys.stderr, flush=True)
    time.sleep(120)

encode.write_jsonl = half_written
from clearformer.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize(("signum", "status", "said"), [
    (signal.SIGTERM, 143, "clearformer: terminated"),
    (signal.SIGINT, 130, "clearformer: interrupted"),
])  # fmt: skip
def test_signal_during_write_leaves_the_earlier_output(
    tmp_path, tiny_checkpoint, signum, status, said
):
    target = tmp_path / "out.jsonl"
    target.write_text("earlier\n")
    argv = ["encode", "--model", str(tiny_checkpoint), "a cat", "-o", str(target)]
    process = subprocess.Popen(
        [sys.executable, "-c", SLOW_WRITER, *argv],
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr.readline().strip() == "WRITING"
        temporary = [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
        assert len(temporary) == 1 and temporary[0].startswith(".out.jsonl."), temporary
        process.send_signal(signum)
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == status, err
    assert err.strip() == said
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]
    assert target.read_text() == "earlier\n"
