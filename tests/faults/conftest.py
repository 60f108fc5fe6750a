"""Fixtures of the fault suite: a tiny checkpoint written by clearformer itself (no
transformers needed), and the CLI as a real subprocess."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ..helpers import write_tiny_bert

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b", "c", "cat", "dog"]


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A random 1-layer BERT checkpoint (width 16) with a WordPiece vocabulary."""
    return write_tiny_bert(tmp_path_factory.mktemp("tiny-bert"), WORDS)


@pytest.fixture
def checkpoint(tiny_checkpoint, tmp_path) -> Path:
    """A copy of the tiny checkpoint that a test may damage."""
    target = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, target)
    return target


def edit_config(directory: Path, **changes) -> None:
    path = directory / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def cli_command(*argv: str) -> list[str]:
    """The ``clearformer`` command line, run by this interpreter (so PYTHONPATH holds)."""
    return [sys.executable, "-m", "clearformer.cli", *argv]


def cli_env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def run_cli(*argv: str, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    """Run the CLI to completion; stdout and stderr captured as text unless overridden."""
    kwargs.setdefault("stdout", subprocess.PIPE)
    kwargs.setdefault("stderr", subprocess.PIPE)
    return subprocess.run(
        cli_command(*argv), env=cli_env(), timeout=timeout, text=True, check=False, **kwargs
    )
