"""The machine's snapshot is read once and frozen; every file clearformer keeps between
processes lands in the one cache folder, whichever setting names it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from clearformer.calibration.cache import CalibrationKey
from clearformer.cpu import cpu_info
from clearformer.machine import cache_folder, machine
from clearformer.precision import speedup


def test_the_snapshot_is_probed_once_and_frozen():
    first = machine()
    assert machine() is first
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.onednn = not first.onednn
    assert first.cpu == cpu_info()
    assert first.avx512.choice in ("available", "unavailable")
    assert first.onednn_bf16 <= first.onednn  # bfloat16 is probed only where float32 runs
    assert first.reorder <= {torch.float32, torch.bfloat16}


@pytest.mark.parametrize("setting", ["own", "xdg", "relative xdg", "home"])
def test_verdicts_and_the_bf16_speedup_share_one_cache_folder(setting, tmp_path, monkeypatch):
    monkeypatch.delenv("CLEARFORMER_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    want = tmp_path / "home" / ".cache" / "clearformer"
    if setting == "own":
        monkeypatch.setenv("CLEARFORMER_CACHE", str(tmp_path / "own"))
        want = tmp_path / "own"
    elif setting == "xdg":
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
        want = tmp_path / "xdg" / "clearformer"
    elif setting == "relative xdg":  # the XDG rules ignore a relative path
        monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    assert cache_folder() == want
    verdicts = CalibrationKey("cpu", "torch", "clearformer", "").path()
    bf16 = speedup.cache_path(cpu_info())
    assert verdicts.parent == bf16.parent == want / "calibration"  # one store
