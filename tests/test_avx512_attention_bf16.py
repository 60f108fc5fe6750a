"""clearformer's AVX-512 attention on bfloat16 rows: widened to float32 for the kernel, the
output rounded back, and taken by ``auto`` on a verdict of its own."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from clearformer import Encoder, EncoderConfig
from clearformer.fast import avx512
from clearformer.packed_attention import varlen_attention
from clearformer.padding import layout_from_cu_seqlens
from clearformer.routes import kernel_route

from .helpers import avx512_in_use, needs_avx512_library, resolve_method
from .test_avx512_attention import packed_qkv, reference

pytestmark = needs_avx512_library

# One bfloat16 step: outputs of softmax-weighted averages of values near 1 round to 2^-8
# of their size; two routes that each round once differ by at most that.
BF16_STEP = 2**-7


def bf16_rows(lengths, heads=3, head_dim=32, seed=0):
    q, k, v, cu = packed_qkv(lengths, heads, head_dim, seed=seed)
    return (*(t.bfloat16() for t in (q, k, v)), cu)


def test_bf16_rows_give_the_float32_kernel_on_the_same_values_rounded_once():
    q, k, v, cu = bf16_rows([1, 7, 16, 33, 0, 90])
    got = avx512.attention(q, k, v, cu, 0.25)
    assert got.dtype == torch.bfloat16 and got.shape == q.shape
    widened = avx512.attention(q.float(), k.float(), v.float(), cu, 0.25)
    assert torch.equal(got, widened.bfloat16())  # the same computation, one rounding
    exact = reference(q, k, v, cu, 0.25)  # float64 on the bfloat16 values
    torch.testing.assert_close(got.double(), exact, atol=BF16_STEP, rtol=BF16_STEP)


def test_bf16_rows_match_pytorchs_bfloat16_attention():
    q, k, v, cu = bf16_rows([5, 12, 12, 40, 3], seed=1)
    layout = layout_from_cu_seqlens(cu.to(torch.int32))
    with torch.inference_mode():
        got = varlen_attention(q, k, v, layout, method="avx512")
        want = varlen_attention(q, k, v, layout, method="sequence")  # SDPA's bfloat16 kernel
    assert got.dtype == want.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), atol=BF16_STEP, rtol=BF16_STEP)


def test_other_dtypes_are_still_refused_by_name():
    q, k, v, cu = packed_qkv([4, 4], heads=2, head_dim=32)
    assert not avx512.serves(q.half(), k.half(), v.half())
    with pytest.raises(RuntimeError, match="float32"):
        avx512.attention(q.half(), k.half(), v.half(), cu, 1.0)


@torch.no_grad()
@pytest.mark.parametrize(("float32_speed", "bf16_speed"), [(1.5, 0.8), (0.8, 1.5)])
def test_each_dtype_takes_the_kernel_on_its_own_verdict(measured, float32_speed, bf16_speed):
    measured(avx512_attention=float32_speed, avx512_attention_bf16=bf16_speed, avx512_linear=1.0)
    layout = layout_from_cu_seqlens(torch.tensor([0, 5, 12, 20], dtype=torch.int32))
    cpu = torch.device("cpu")
    for dtype, speed in ((torch.float32, float32_speed), (torch.bfloat16, bf16_speed)):
        method = resolve_method("auto", layout, device=cpu, dtype=dtype, head_dim=32)
        assert (method.choice == "avx512") == (speed > 1), (dtype, method)
        assert avx512_in_use(dtype) == (speed > 1)
    taken = kernel_route("avx512_attention_bf16")
    assert "bfloat16 rows" in taken.reason and f"{bf16_speed:.2f}x" in taken.reason


@torch.no_grad()
def test_no_bf16_verdict_keeps_pytorchs_route_for_bf16_rows(measured):
    measured(avx512_attention=1.5, avx512_linear=1.0)  # a cache from before the bf16 verdict
    layout = layout_from_cu_seqlens(torch.tensor([0, 5, 12], dtype=torch.int32))
    cpu = torch.device("cpu")
    assert resolve_method("auto", layout, device=cpu, head_dim=32).choice == "avx512"
    bf16 = resolve_method("auto", layout, device=cpu, dtype=torch.bfloat16, head_dim=32)
    assert bf16.choice != "avx512" and "clearformer calibrate" in bf16.reason


def test_the_attention_switch_turns_off_both_dtypes(monkeypatch):
    monkeypatch.setenv("CLEARFORMER_AVX512", "on")
    monkeypatch.setenv("CLEARFORMER_AVX512_ATTENTION", "off")
    assert not avx512_in_use(torch.float32) and not avx512_in_use(torch.bfloat16)
    monkeypatch.delenv("CLEARFORMER_AVX512_ATTENTION")
    assert avx512_in_use(torch.float32) and avx512_in_use(torch.bfloat16)


def test_a_bf16_encoder_gives_pytorchs_rows_through_the_kernel(monkeypatch):
    monkeypatch.setenv("CLEARFORMER_AVX512", "on")
    calls = []
    kernel = avx512.attention
    monkeypatch.setattr(avx512, "attention", lambda *a: calls.append(a[0].dtype) or kernel(*a))
    torch.manual_seed(0)
    config = EncoderConfig(d_model=64, n_heads=2, n_layers=2, dim_mlp=128, dropout=0.0)
    encoder = Encoder(config).eval().to(torch.bfloat16)
    x = torch.randn(4, 37, 64, dtype=torch.bfloat16)
    mask = torch.arange(37) < torch.tensor([37, 20, 5, 30])[:, None]  # (B, T) ragged
    x_masked = x.masked_fill(~mask[..., None], 1e4)  # padded positions hold anything
    with torch.inference_mode():
        plan = encoder.plan_for(mask)
        assert plan.method.choice == "avx512"
        got = encoder(x_masked, mask)
        unmasked = encoder(x)  # no padding: the padded layout, through the same kernel
    assert calls and set(calls) == {torch.bfloat16}
    monkeypatch.setenv("CLEARFORMER_AVX512", "off")  # PyTorch's bfloat16 kernels
    with torch.inference_mode():
        assert encoder.plan_for(mask).method.choice != "avx512"
        want = encoder(x, mask)
        want_unmasked = encoder(x)
    assert got.dtype == torch.bfloat16
    # Two layers of bfloat16: a rounding step apart in attention can move a LayerNorm's
    # output by a few steps.
    torch.testing.assert_close(got.float(), want.float(), atol=0.05, rtol=0.02)
    torch.testing.assert_close(unmasked.float(), want_unmasked.float(), atol=0.05, rtol=0.02)
    assert (got[~mask] == 0).all()


def test_the_unmasked_padded_path_takes_bf16_rows_too(monkeypatch):
    from clearformer.kernels import KERNELS
    from clearformer.plan import plan_layer

    monkeypatch.setenv("CLEARFORMER_AVX512", "on")
    calls = []
    kernel = avx512.attention
    monkeypatch.setattr(avx512, "attention", lambda *a: calls.append(1) or kernel(*a))
    x = torch.randn(3, 50, 3, 2, 32, dtype=torch.bfloat16)
    q, k, v = (t.transpose(1, 2) for t in x.unbind(2))  # (B, H, T, Dh) views
    with torch.no_grad():
        plan = plan_layer(
            None, batch=3, heads=2, tq=50, tk=50, device=q.device, dtype=q.dtype, head_dim=32
        )
        assert plan.padded_route.choice == "avx512", plan.padded_route
        got, _ = KERNELS["sdpa"](q, k, v, plan, 0.0, None, None)
    want = F.scaled_dot_product_attention(q, k, v)
    assert calls == [1] and got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), atol=BF16_STEP, rtol=BF16_STEP)
