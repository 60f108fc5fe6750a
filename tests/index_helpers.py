"""Shared pieces of the index and shard tests: a tiny checkpoint, a corpus, the CLI in a
subprocess with a fault injected."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from .helpers import torchrun_command, write_tiny_bert

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(60)]

# The CLI, with a function of clearformer replaced by one that kills the process with SIGKILL
# on its Nth call: argv[1] is "module:attribute:N", the rest is the command line.
# Script lines that replace `target` ("module:attribute") by a function that kills the process
# with SIGKILL on its `count`th call; the script defines both first.
DIE_ON_CALL = """
import importlib, os, signal
module_name, attribute = target.split(":")
owner = importlib.import_module(module_name)
path = attribute.split(".")
for name in path[:-1]:
    owner = getattr(owner, name)
original = getattr(owner, path[-1])
calls = [0]
def dying(*args, **kwargs):
    calls[0] += 1
    if calls[0] >= int(count):
        os.kill(os.getpid(), signal.SIGKILL)
    return original(*args, **kwargs)
setattr(owner, path[-1], dying)
"""
KILL_AT = (
    """
import sys
target, count = sys.argv[1].rsplit(":", 1)
"""
    + DIE_ON_CALL
    + """
from clearformer.cli import main
sys.exit(main(sys.argv[2:]))
"""
)


# The CLI with faults put into clearformer's functions, for a run under torchrun (a script
# file: torchrun runs a script, not ``-c``). argv[1] is a JSON list of faults: on the ``call``th
# call of ``target`` ("module:attribute"), in the process of rank ``rank`` (any if null), first
# create the file ``touch`` (if given: a signal to another process), then wait until the file
# ``wait_for`` exists (if given), then SIGKILL the process if ``kill``; else the call goes on.
# The rest of argv is the command line.
FAULTS = """
import importlib, json, os, signal, sys, time
from pathlib import Path

def install(target, call, rank=None, touch=None, wait_for=None, kill=False):
    if rank is not None and os.environ.get("RANK") != str(rank):
        return
    module_name, attribute = target.split(":")
    owner = importlib.import_module(module_name)
    path = attribute.split(".")
    for name in path[:-1]:
        owner = getattr(owner, name)
    original = getattr(owner, path[-1])
    calls = [0]
    def faulty(*args, **kwargs):
        calls[0] += 1
        if calls[0] == call:
            if touch:
                Path(touch).touch()
            deadline = time.monotonic() + 120
            while wait_for and not Path(wait_for).exists():
                if time.monotonic() > deadline:
                    sys.exit(f"fault in {target}: waited 120 s for {wait_for}")
                time.sleep(0.02)
            if kill:
                os.kill(os.getpid(), signal.SIGKILL)
        return original(*args, **kwargs)
    setattr(owner, path[-1], faulty)

for fault in json.loads(sys.argv[1]):
    install(**fault)
from clearformer.cli import main
sys.exit(main(sys.argv[2:]))
"""


def tiny_model(directory: Path) -> Path:
    return write_tiny_bert(directory, WORDS)


def word_texts(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(f"w{j}" for j in rng.integers(0, 60, 1 + i % 7)) for i in range(n)]


def env() -> dict[str, str]:
    root = Path(__file__).resolve().parents[1] / "src"
    path = os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])
    return {
        **os.environ,
        "PYTHONPATH": path,
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
        "PYTHONFAULTHANDLER": "1",  # an aborting worker prints its threads' Python stacks
    }


def cli(*argv: str) -> subprocess.CompletedProcess:
    """The CLI in this process (no interpreter to start, no torch to import again), with its
    exit status and output as a subprocess would give them."""
    import contextlib
    import io

    from clearformer.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def killed_cli(target: str, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """The CLI killed by SIGKILL on the ``N``th call of ``target`` ("module:attr:N")."""
    return subprocess.run(
        [sys.executable, "-c", KILL_AT, target, *argv],
        env=env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def torchrun(nproc: int, *argv: str, timeout: float = 180) -> subprocess.CompletedProcess:
    command = torchrun_command(nproc, *argv)
    return subprocess.run(
        command, env=env(), capture_output=True, text=True, timeout=timeout, check=False
    )


def faulty_torchrun(
    nproc: int, script_dir: Path, faults: list[dict], *argv: str, timeout: float = 180
) -> subprocess.CompletedProcess:
    """``clearformer`` (``argv``) in ``nproc`` processes under torchrun, with ``faults`` put in
    (see :data:`FAULTS`); the script is written to ``script_dir``."""
    import json

    script = script_dir / "faulty_cli.py"
    script.write_text(FAULTS, encoding="utf-8")
    command = torchrun_command(nproc, str(script), json.dumps(faults), *argv)
    return subprocess.run(
        command, env=env(), capture_output=True, text=True, timeout=timeout, check=False
    )
