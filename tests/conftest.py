"""Shared test settings: deterministic seeds, a Hypothesis profile sized for 2 CPU cores."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

settings.register_profile(
    "default",
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("thorough", max_examples=200, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _attention_kernel_state(request, monkeypatch):
    """Outside test_avx512_attention, tests run as on a CPU where clearformer's AVX-512
    attention kernel is not preferred: on an AMD CPU with the kernel built, ``auto`` would take
    it, and what it picks would depend on the machine that runs the suite."""
    from clearformer.kernels import avx512

    if not request.module.__name__.endswith("test_avx512_attention"):
        monkeypatch.setattr(avx512, "preferred", lambda: False)
    yield
