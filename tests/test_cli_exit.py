"""How the ``clearformer`` process ends: a run stopped by a signal ends with its documented
status (143 for SIGTERM, 130 for SIGINT) even while a thread is inside torch's native code, as
``encode``'s batch workers are. A normal finalization would end such a thread with
pthread_exit, which cannot unwind through torch's C++ frame: "terminate called without an
active exception" and SIGABRT (134)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import clearformer.cli as cli

# A thread looping over torch products (native code, the GIL released and taken back at each),
# as a batch worker is in the middle of a forward pass; then the command's status.
CHILD = """
import sys, threading, time, torch
import clearformer.cli as cli

def compute():
    x = torch.ones(64, 64)
    while True:
        x @ x

threading.Thread(target=compute, daemon=True).start()
time.sleep(0.2)
cli.main = lambda: int(sys.argv[1])
cli.entry()
"""


@pytest.mark.parametrize("status", [cli.EXIT_SIGTERM, cli.EXIT_SIGINT])
def test_a_stopped_run_exits_with_its_status_while_a_thread_computes(status):
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(status)], capture_output=True, text=True, timeout=120
    )
    assert child.returncode == status, child.stderr
    assert "terminate called" not in child.stderr


def test_other_statuses_end_as_usual(monkeypatch):
    ended = []
    monkeypatch.setattr(cli, "main", lambda: 2)
    monkeypatch.setattr(cli.os, "_exit", ended.append)
    with pytest.raises(SystemExit) as exited:
        cli.entry()
    assert exited.value.code == 2 and ended == []
