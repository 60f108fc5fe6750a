"""The switches of clearformer's own kernels (clearformer.switches): which setting wins, and
``CLEARFORMER_KERNELS=off`` keeping every clearformer kernel out of every route, a library
already built and loaded included (its entry points are patched to raise, and the plan's
decisions say why), while the same calls with the switch on do reach them."""

from __future__ import annotations

import pytest
import torch

from clearformer import Encoder, EncoderConfig, switches
from clearformer.fast import avx512, avx512_linear
from clearformer.fast.reordered_weights import ReorderedWeights, use_reordered_weights
from clearformer.packed_attention import varlen_attention
from clearformer.padding import layout_from_cu_seqlens
from clearformer.routes import kernels_wanted

from .helpers import avx512_in_use, needs_avx512_library

VARIABLES = (
    "CLEARFORMER_KERNELS",
    "CLEARFORMER_AVX512",
    "CLEARFORMER_AVX512_ATTENTION",
    "CLEARFORMER_AVX512_LINEAR",
)


@pytest.fixture
def unset(monkeypatch):
    for variable in VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    return monkeypatch


@pytest.mark.parametrize(
    "environment, attention, linear",
    [
        ({}, "auto", "auto"),
        ({"CLEARFORMER_AVX512": "on"}, "on", "on"),
        ({"CLEARFORMER_AVX512": "on", "CLEARFORMER_KERNELS": "off"}, "off", "off"),
        ({"CLEARFORMER_AVX512_LINEAR": "off", "CLEARFORMER_AVX512": "on"}, "on", "off"),
        ({"CLEARFORMER_AVX512_LINEAR": "on", "CLEARFORMER_AVX512": "off"}, "off", "off"),
        ({"CLEARFORMER_AVX512_LINEAR": "on"}, "auto", "on"),
        ({"CLEARFORMER_AVX512_ATTENTION": "on", "CLEARFORMER_AVX512_LINEAR": "off"}, "on", "off"),
        ({"CLEARFORMER_AVX512_ATTENTION": "off", "CLEARFORMER_AVX512": "on"}, "off", "on"),
        ({"CLEARFORMER_KERNELS": "on", "CLEARFORMER_AVX512": "auto"}, "auto", "auto"),
        ({"CLEARFORMER_KERNELS": "on"}, "on", "on"),
        ({"CLEARFORMER_AVX512": "0"}, "off", "off"),
    ],
)
def test_off_anywhere_wins_then_the_most_specific_setting(unset, environment, attention, linear):
    for variable, value in environment.items():
        unset.setenv(variable, value)
    assert switches.kernel_setting("avx512_attention").choice == attention
    assert switches.kernel_setting("avx512_linear").choice == linear
    int8 = "off" if environment.get("CLEARFORMER_KERNELS") == "off" else None
    assert switches.kernel_setting("int8_steps").choice in ((int8,) if int8 else ("on", "auto"))


def test_a_bad_value_or_kernel_name_is_refused_naming_it(unset):
    unset.setenv("CLEARFORMER_KERNELS", "fast")
    with pytest.raises(
        ValueError, match="CLEARFORMER_KERNELS: expected 'on', 'off' or 'auto', got 'fast'"
    ):
        switches.kernel_setting("avx512_attention")
    unset.delenv("CLEARFORMER_KERNELS")
    with pytest.raises(ValueError, match="kernel: expected one of .* got 'flash'"):
        switches.kernel_setting("flash")


def post_norm_encoder() -> Encoder:
    torch.manual_seed(0)
    config = EncoderConfig(
        d_model=64,
        n_heads=2,
        n_layers=2,
        dim_mlp=128,
        norm="post",
        activation="gelu",
        dropout=0.0,
    )
    return Encoder(config).eval()


def run_every_route(encoder: Encoder) -> dict[str, torch.Tensor]:
    """The encoder on packed rows (varlen), on padded rows with one run of keys per sequence
    and unmasked (sdpa), under reordered weights (the linear kernel's condition)."""
    x = torch.randn(4, 30, 64, generator=torch.Generator().manual_seed(1))
    mask = torch.arange(30) < torch.tensor([30, 12, 7, 25])[:, None]
    with torch.inference_mode(), use_reordered_weights(ReorderedWeights()):
        return {
            "varlen": encoder(x, mask, backend="varlen")[mask],
            "sdpa": encoder(x, mask, backend="sdpa")[mask],
            "unmasked": encoder(x),
        }


class TestTheLibraryLoaded:
    pytestmark = needs_avx512_library

    def test_kernels_off_takes_no_clearformer_kernel_though_loaded(self, unset):
        encoder = post_norm_encoder()
        calls = []
        entry_points = [
            (avx512, "attention"),
            (avx512, "padded_attention"),
            (avx512_linear, "linear"),
        ]
        for module, name in entry_points:
            original = getattr(module, name)
            unset.setattr(
                module, name, lambda *a, _f=original, _n=name, **k: calls.append(_n) or _f(*a, **k)
            )
        unset.setenv("CLEARFORMER_AVX512", "on")  # every kernel taken wherever it serves
        with_kernels = run_every_route(encoder)
        assert {"attention", "padded_attention", "linear"} <= set(calls), calls  # the control

        def refuse(*args, **kwargs):
            raise AssertionError("a clearformer kernel ran with CLEARFORMER_KERNELS=off")

        for module, name in entry_points:
            unset.setattr(module, name, refuse)
        unset.setenv("CLEARFORMER_KERNELS", "off")
        assert avx512.is_loaded()  # built and loaded, and still not taken
        without = run_every_route(encoder)
        for route, out in with_kernels.items():
            torch.testing.assert_close(without[route], out, atol=2e-5, rtol=1e-5)
        mask = torch.arange(30) < torch.tensor([30, 12, 7, 25])[:, None]
        with torch.no_grad():
            plan = encoder.plan_for(mask, backend="varlen")
            padded = encoder.plan_for(None, shape=(4, 30), device=torch.device("cpu"))
        assert plan.method.choice != "avx512"
        for decision in (plan.method, plan.linear, padded.kernel):
            assert "CLEARFORMER_KERNELS=off" in decision.reason, str(plan)
        assert not avx512_in_use() and not kernels_wanted(("avx512_linear",))

    @torch.no_grad()
    def test_kernels_off_refuses_the_kernel_by_name_where_avx512_off_does_not(self, unset):
        cu = torch.tensor([0, 5, 12], dtype=torch.int32)
        layout = layout_from_cu_seqlens(cu)
        q, k, v = torch.randn(12, 3, 2, 32).unbind(1)
        unset.setenv("CLEARFORMER_AVX512", "off")  # auto's choice only: by name it still runs
        by_name = varlen_attention(q, k, v, layout, method="avx512")
        torch.testing.assert_close(
            by_name, varlen_attention(q, k, v, layout, reference=True), atol=2e-6, rtol=0
        )
        unset.setenv("CLEARFORMER_KERNELS", "off")
        with pytest.raises(
            ValueError, match="method='avx512' cannot run here: CLEARFORMER_KERNELS"
        ):
            varlen_attention(q, k, v, layout, method="avx512")


def test_kernels_off_runs_the_int8_steps_eagerly(unset):
    from clearformer.quant import int8

    def refuse():
        raise AssertionError("the compiled int8 steps were asked for")

    layer = int8.Int8Linear.from_linear(torch.nn.Linear(32, 16))
    layer.fused = True
    x = torch.randn(5, 32)
    unset.setenv("CLEARFORMER_KERNELS", "off")
    unset.setattr(int8, "fused_steps", refuse)
    with torch.inference_mode():
        assert layer.fused_call(x) is None
        out = layer(x)
        layer.fused = False
        torch.testing.assert_close(out, layer(x))  # what the eager steps give
