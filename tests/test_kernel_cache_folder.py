"""No cache folder at all: no ``$CLEARFORMER_CACHE``, no ``$XDG_CACHE_HOME``, no ``$HOME``, and
a uid without a passwd entry (``docker run --user 12345``), where ``Path.home()`` raises.
clearformer then keeps nothing between processes: PyTorch's routes, nothing built, measured
or written, and a forward pass runs as anywhere else."""

from __future__ import annotations

import dataclasses
import pwd

import pytest
import torch

from clearformer import Encoder, EncoderConfig, kernel_routes
from clearformer.calibration import cache, kernels
from clearformer.cpu import CpuInfo
from clearformer.fast import avx512
from clearformer.machine import NoCacheFolder, cache_folder, machine
from clearformer.options import Decision
from clearformer.precision import speedup


@pytest.fixture
def homeless(tmp_path, monkeypatch):
    """A process with no cache folder, on a machine that could build the kernels, with
    ``auto`` left to the measured verdicts; its working folder is ``tmp_path``."""

    def no_entry(uid):
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    for variable in ("HOME", "CLEARFORMER_CACHE", "XDG_CACHE_HOME", "CLEARFORMER_AVX512"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.delenv("CLEARFORMER_CALIBRATION", raising=False)
    able = dataclasses.replace(machine(), avx512=Decision("available", "a test's machine"))
    for module in (avx512, kernel_routes, kernels):
        monkeypatch.setattr(module, "machine", lambda: able)
    monkeypatch.setattr(avx512, "_state", {})
    # The folder as this process sees it now, not as an earlier test's call left it.
    monkeypatch.setattr(avx512, "library_path", avx512.library_path.__wrapped__)
    monkeypatch.chdir(tmp_path)
    cache.forget()
    yield tmp_path
    cache.forget()


def test_the_cache_folder_is_absent_not_a_crash(homeless):
    with pytest.raises(NoCacheFolder, match="CLEARFORMER_CACHE") as raised:
        cache_folder()
    assert isinstance(raised.value, OSError)  # what the callers treat as a cache they lack


def test_a_forward_pass_keeps_pytorchs_routes_and_writes_nothing(homeless):
    torch.manual_seed(0)
    config = EncoderConfig(d_model=64, n_heads=2, n_layers=1, dim_mlp=128, norm="post")
    model = Encoder(config).eval()
    x = torch.randn(3, 20, 64)
    mask = torch.arange(20) < torch.tensor([5, 12, 20])[:, None]
    with torch.inference_mode():
        assert model(x, mask).shape == (3, 20, 64)
    assert kernel_routes.kernel_route("avx512_attention").choice == "torch"
    loaded = avx512.load(build=True)
    assert loaded.choice == "unavailable" and "no cache folder" in loaded.reason
    calibration = kernels.calibrate()
    assert not calibration.measured and calibration.verdicts == {}
    ratio, source = speedup.bf16_speedup(
        CpuInfo("Test CPU", "AuthenticAMD", "25 / 17", 2, frozenset({"avx512_bf16"})),
        measure=lambda: 1.5,
    )
    assert ratio == 1.5 and "not cached" in source
    assert list(homeless.iterdir()) == []  # nothing written, not even beside the process
