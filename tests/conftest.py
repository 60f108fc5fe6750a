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
def _attention_kernel_state(request):
    """Every test outside test_avx512_attention runs in a process without the AVX-512 attention
    kernel loaded: an ``encode`` call loads a built one on AMD CPUs, and what ``auto`` picks
    would then depend on which tests ran before."""
    from clearformer.kernels import avx512

    if request.module.__name__.endswith("test_avx512_attention"):
        yield
        return
    avx512._state.pop("load", None)
    yield
    avx512._state.pop("load", None)
