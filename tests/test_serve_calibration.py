"""``clearformer serve`` measures clearformer's own kernels on this CPU before it loads its
models, once per machine, so that it takes each where it is faster from its first request."""

from __future__ import annotations

import pytest

from clearformer.calibration import kernels
from clearformer.calibration.kernels import Calibration

from .helpers import needs_avx512_library
from .test_calibration import verdict_of

pytest.importorskip("uvicorn")

from clearformer.serve import ModelSpec, ServeConfig  # noqa: E402
from clearformer.serve.state import ServerState  # noqa: E402


def test_the_server_measures_the_kernels_before_it_loads_a_model(monkeypatch):
    order = []
    verdict = verdict_of([{"torch": 0.02, "avx512": 0.01}])
    measured = Calibration({"avx512_attention": verdict}, None, True, "measured")
    monkeypatch.setattr(
        kernels, "measure_before_serving", lambda: order.append("measure") or measured
    )
    load_one = ServerState._load_one
    monkeypatch.setattr(
        ServerState, "_load_one", lambda self, spec: order.append("load") or load_one(self, spec)
    )
    messages = []
    state = ServerState(ServeConfig(workers=1), [ModelSpec()], report=messages.append)
    state.start_loading().join(120)
    try:
        assert state.status == "ready", state.load_error
        assert order == ["measure", "load"]
        assert "measured clearformer's kernels on this CPU: avx512_attention avx512" in messages[0]
    finally:
        state.finish()


def test_nothing_is_measured_where_calibration_is_off(monkeypatch):
    monkeypatch.setattr(kernels, "calibrate", lambda **_: pytest.fail("measured"))
    assert kernels.measure_before_serving() is None  # the suite's CLEARFORMER_CALIBRATION=off


class TestOnAnAVX512CPU:
    pytestmark = needs_avx512_library

    def test_it_measures_only_what_is_not_cached_yet(self, measured, monkeypatch):
        calls = []
        monkeypatch.setattr(kernels, "calibrate", lambda **_: calls.append(1) or "calibrated")
        measured(avx512_attention=1.2, avx512_linear=1.0)  # a cache without the bf16 verdict
        assert kernels.measure_before_serving() == "calibrated" and calls == [1]
        every = dict(
            avx512_attention_bf16=1.1,
            avx512_linear=1.0,
            avx512_linear_rows=1.1,
            avx512_flash=1.1,
            avx512_flash_bf16=1.1,
            avx512_dropout=1.1,
        )
        measured(avx512_attention=1.2, **every)
        assert kernels.measure_before_serving() is None and calls == [1]
        monkeypatch.setenv("CLEARFORMER_AVX512", "on")  # taken unmeasured: nothing to measure
        measured(avx512_attention=1.2)
        assert kernels.measure_before_serving() is None and calls == [1]
