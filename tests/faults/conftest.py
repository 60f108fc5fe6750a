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
import torch

from clearformer import EncoderConfig, EncoderModel
from clearformer.interop.hf import save_model

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b", "c", "cat", "dog"]


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A random 1-layer BERT checkpoint (width 16) with a WordPiece vocabulary."""
    directory = tmp_path_factory.mktemp("tiny-bert")
    torch.manual_seed(0)
    config = EncoderConfig(
        d_model=16,
        n_heads=2,
        n_layers=1,
        dim_mlp=32,
        norm="post",
        activation="gelu",
        norm_eps=1e-12,
        final_norm=False,
        vocab_size=len(WORDS),
        max_positions=32,
        type_vocab_size=2,
        embedding_norm=True,
    )
    save_model(EncoderModel(config).eval(), directory, "bert")
    (directory / "vocab.txt").write_text("\n".join(WORDS) + "\n", encoding="utf-8")
    return directory


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
