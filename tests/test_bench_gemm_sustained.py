"""``sustained_gemm_rate``: the best and the median round of the bound's own products."""

from __future__ import annotations

from clearformer.bench.gemm import sustained_gemm_rate
from clearformer.bench.workloads import ModelSize


def test_the_median_round_is_never_faster_than_the_best():
    size = ModelSize(name="tiny", d_model=32, n_heads=2, dim_mlp=64, n_layers=1)
    rates = sustained_gemm_rate(size, tokens=64, rounds=5)
    assert set(rates) == {"best", "median"}
    assert 0 < rates["median"] <= rates["best"]
