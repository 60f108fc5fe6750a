"""Shared test settings: deterministic seeds, a Hypothesis profile sized for 2 CPU cores."""

from __future__ import annotations

import os

# Set before PyTorch loads its OpenMP runtime (libgomp reads it once, at load). The README's
# command runs the suite as two workers on two cores (``-n 2``), each with PyTorch's default of
# one intra-op thread per core, so four threads share two cores. By default an OpenMP thread
# that has finished its part of a parallel region keeps spinning on its core for a while before
# it sleeps, and the spinning takes the core from the other worker's threads: measured on a
# 2-core machine, two workers ran six of the suite's files (677 tests) 2.4x slower in wall
# time, with three times the CPU time, than with passive waiting. Passive waiting changes when
# an idle thread sleeps, not how many threads there are nor how work is split among them, so
# every code path and every result stays what it was; subprocesses that tests start inherit
# it. A lone process is faster with the default (no thread waits to be woken: two of those
# files took 5 s instead of 7), so only the workers of a parallel run set it. A value set
# outside the suite wins.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402
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


# The suite runs as on a CPU where clearformer's AVX-512 kernels are not taken (the AVX-512
# tests say otherwise where they mean to): on a CPU with the library built and measured faster,
# ``auto`` would take them, and what it picks would depend on the machine that runs the suite.
# Nothing is measured either, and no verdict cached in the user's folder is read
# (CLEARFORMER_CALIBRATION=off); the calibration tests inject their own. Environment variables
# rather than patches, so that module-scoped fixtures and the subprocesses the CLI tests start
# see the same settings.
os.environ["CLEARFORMER_AVX512"] = "off"
os.environ["CLEARFORMER_CALIBRATION"] = "off"


@pytest.fixture(scope="module")
def avx512_library():
    """clearformer's AVX-512 library, built if need be and loaded for one module of tests
    (``helpers.needs_avx512_library``); afterwards the other modules see a process without
    it, as their expectations assume."""
    from clearformer.fast import avx512

    outcome = avx512.load(build=True)
    assert outcome.choice == "loaded", outcome.reason
    yield outcome
    avx512._state.pop("load", None)


@pytest.fixture
def measured(tmp_path, monkeypatch):
    """``auto`` with calibration on, reading kernel verdicts injected into a cache of its own:
    ``measured(avx512_attention=1.2, ...)`` records each kernel as that many times faster than
    PyTorch's route (below 1: slower) and returns the cache file. Needs the AVX-512 library
    loaded (``helpers.needs_avx512_library``)."""
    from clearformer.calibration import cache
    from clearformer.fast import avx512

    from .test_calibration import verdict_of

    for variable in ("CLEARFORMER_AVX512", "CLEARFORMER_CALIBRATION", "CLEARFORMER_KERNELS"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("CLEARFORMER_CACHE", str(tmp_path))
    assert avx512.is_loaded()  # the library built and loaded (avx512_library)

    def inject(**speeds):
        verdicts = {
            kernel: verdict_of([{"torch": 0.01 * speed, "avx512": 0.01}])
            for kernel, speed in speeds.items()
        }
        return cache.write(avx512.calibration_key(), verdicts)

    yield inject
    cache.forget()
