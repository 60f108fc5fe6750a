"""Shared pieces of the training tests: tiny configs, subprocess runs, run weights."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from safetensors.torch import load_file

from clearformer.train import TrainConfig

# A digits run that takes about a second: width 16, one layer, 40 steps.
TINY = {
    "steps": 40,
    "batch_size": 32,
    "warmup_steps": 5,
    "eval_every": 10,
    "log_every": 5,
    "checkpoint_every": 10,
    "d_model": 16,
    "n_heads": 2,
    "n_layers": 1,
    "dim_mlp": 32,
    "dropout": 0.1,
}


def tiny(**changes) -> TrainConfig:
    return TrainConfig(**{**TINY, **changes})


def tiny_flags(**changes) -> list[str]:
    flags = []
    for key, value in {**TINY, **changes}.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + flag[2:])
        else:
            flags += [flag, str(value)]
    return flags


def env(**extra: str) -> dict[str, str]:
    root = Path(__file__).resolve().parents[1] / "src"
    path = os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])
    # PYTHONFAULTHANDLER: a worker that aborts (SIGABRT at exit, say) prints every thread's
    # Python stack into the output a failing test shows.
    return {
        **os.environ,
        "PYTHONPATH": path,
        "PYTHONUNBUFFERED": "1",
        "PYTHONFAULTHANDLER": "1",
        **extra,
    }


def run_train(*argv: str, timeout: float = 300, **extra_env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "clearformer.cli", "train", *argv],
        env=env(**extra_env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def final_weights(run: Path) -> dict:
    return load_file(run / "model.safetensors")


def same_weights(a: dict, b: dict) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
