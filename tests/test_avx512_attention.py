"""clearformer's AVX-512 packed-attention kernel (clearformer.fast.avx512): the same values
as the reference formula on every sequence, the plan's rules for when it runs, and its build
cache. Skipped, with the reason, where this machine cannot build it."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from clearformer import Encoder, EncoderConfig, kernel_routes
from clearformer.fast import avx512
from clearformer.machine import machine
from clearformer.options import Decision
from clearformer.packed_attention import varlen_attention
from clearformer.padding import layout_from_cu_seqlens
from clearformer.routes import kernels_wanted

from .helpers import avx512_in_use, needs_avx512_library, resolve_method

pytestmark = needs_avx512_library


@pytest.fixture
def preferred(monkeypatch):
    """As on a CPU where ``auto`` takes the kernel (whatever this one is, measured or not)."""
    monkeypatch.setenv("CLEARFORMER_AVX512", "on")


def packed_qkv(lengths, heads, head_dim, seed=0, magnitude=1.0):
    """q, k, v (N, H, Dh): strided views of one (N, 3, H, Dh) projection, as attention gets
    them, and cu_seqlens."""
    g = torch.Generator().manual_seed(seed)
    n = sum(lengths)
    qkv = torch.randn(n, 3, heads, head_dim, generator=g) * magnitude
    cu = torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int64)
    q, k, v = qkv.unbind(1)
    return q, k, v, cu


def reference(q, k, v, cu, scale):
    """softmax(q k^T scale) v per sequence, in float64."""
    out = torch.empty(q.shape, dtype=torch.float64)
    for b in range(len(cu) - 1):
        lo, hi = int(cu[b]), int(cu[b + 1])
        if hi == lo:
            continue
        qs, ks, vs = (t[lo:hi].double().transpose(0, 1) for t in (q, k, v))  # (H, L, Dh)
        weights = torch.softmax(qs @ ks.transpose(1, 2) * scale, dim=-1)
        out[lo:hi] = (weights @ vs).transpose(0, 1)
    return out


@pytest.mark.parametrize("head_dim", [16, 32, 48, 64])
def test_every_length_matches_the_reference_formula(head_dim):
    # Lengths on both sides of the 16-key vectors, the 32-key blocks and the 8-query blocks (and
    # last blocks of four queries or fewer, which take a four-row block), an
    # empty sequence, and one longer than the 256 rows a BERT sequence can have; head widths of
    # an odd and an even number of vectors (the values' 32-column blocks and their tail).
    lengths = [1, 4, 7, 8, 9, 12, 15, 16, 17, 20, 31, 33, 0, 64, 130, 300]
    q, k, v, cu = packed_qkv(lengths, heads=3, head_dim=head_dim)
    scale = head_dim**-0.5
    got = avx512.attention(q, k, v, cu, scale)
    assert got.shape == q.shape and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), reference(q, k, v, cu, scale), atol=2e-6, rtol=0)


def test_large_scores_saturate_the_softmax_without_overflow():
    # Scores of several thousand: a softmax that did not subtract the row maximum would give
    # inf / inf = NaN; exp of the most negative ones underflows to 0.
    q, k, v, cu = packed_qkv([5, 40, 17], heads=2, head_dim=32, magnitude=30.0)
    got = avx512.attention(q, k, v, cu, 1.0)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.double(), reference(q, k, v, cu, 1.0), atol=1e-4, rtol=1e-5)


@settings(max_examples=30, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 70), min_size=1, max_size=6),
    position=st.integers(0, 5),
    seed=st.integers(0, 2**16),
)
def test_a_sequence_gives_the_same_bits_whatever_its_batch_mates(lengths, position, seed):
    position = min(position, len(lengths))
    alone_len = 23
    q, k, v, cu = packed_qkv([alone_len], heads=2, head_dim=32, seed=seed)
    alone = avx512.attention(q, k, v, cu, 0.2)
    # The same rows among other sequences, whose values are anything (huge ones included).
    others = packed_qkv(lengths, heads=2, head_dim=32, seed=seed + 1, magnitude=1e3)
    rows = [t.contiguous() for t in others[:3]]
    lo = sum(lengths[:position])
    pairs = zip(rows, (q, k, v), strict=True)
    joined = [torch.cat([r[:lo], t.contiguous(), r[lo:]]) for r, t in pairs]
    lens = [*lengths[:position], alone_len, *lengths[position:]]
    cu_joined = torch.tensor([0, *np.cumsum(lens)], dtype=torch.int64)
    together = avx512.attention(*joined, cu_joined, 0.2)
    assert torch.equal(together[lo : lo + alone_len], alone)


def test_bad_input_is_refused_with_a_message():
    q, k, v, cu = packed_qkv([4, 4], heads=2, head_dim=32)
    with pytest.raises(RuntimeError, match="float32"):
        avx512.attention(q.double(), k.double(), v.double(), cu, 1.0)
    with pytest.raises(RuntimeError, match="multiple of 16"):
        avx512.attention(q[..., :24], k[..., :24], v[..., :24], cu, 1.0)
    with pytest.raises(RuntimeError, match="end by N"):
        avx512.attention(q, k, v, torch.tensor([0, 4, 9]), 1.0)


@torch.no_grad()
def test_auto_takes_it_where_preferred_and_not_for_causal_rows(preferred):
    layout = layout_from_cu_seqlens(torch.tensor([0, 5, 12, 20], dtype=torch.int32))
    cpu = torch.device("cpu")
    assert resolve_method("auto", layout, device=cpu, head_dim=32).choice == "avx512"
    with torch.enable_grad():  # training: it has no backward
        assert resolve_method("auto", layout, device=cpu, head_dim=32).choice != "avx512"
    # Causal rows are the float32 flash kernel's (its own verdict), not this kernel's.
    causal = resolve_method("auto", layout, device=cpu, head_dim=32, is_causal=True)
    assert causal.choice == "avx512" and "flash attention (float32)" in causal.reason
    for other in (
        resolve_method("auto", layout, device=cpu, head_dim=24),
        resolve_method("auto", layout, device=cpu, dtype=torch.float64, head_dim=32),
    ):
        assert other.choice != "avx512"


def test_auto_leaves_it_out_where_switched_off(monkeypatch):
    monkeypatch.setenv("CLEARFORMER_AVX512", "off")
    layout = layout_from_cu_seqlens(torch.tensor([0, 5, 12], dtype=torch.int32))
    assert resolve_method("auto", layout, device=torch.device("cpu"), head_dim=32).choice != (
        "avx512"
    )


@torch.no_grad()
def test_it_may_be_built_wherever_it_can_be_but_auto_takes_it_only_on_or_measured(monkeypatch):
    monkeypatch.delenv("CLEARFORMER_AVX512", raising=False)
    assert kernels_wanted() == (machine().avx512.choice == "available")  # any vendor
    layout = layout_from_cu_seqlens(torch.tensor([0, 5, 12], dtype=torch.int32))
    cpu = torch.device("cpu")
    # auto without a measurement (the suite reads none): PyTorch's route, saying why
    auto = resolve_method("auto", layout, device=cpu, head_dim=32)
    assert auto.choice != "avx512" and "PyTorch's route kept" in auto.reason
    assert not avx512_in_use()
    without = dataclasses.replace(machine(), avx512=Decision("unavailable", "no AVX-512"))
    monkeypatch.setattr(kernel_routes, "machine", lambda: without)
    assert not kernels_wanted()
    monkeypatch.undo()
    monkeypatch.setenv("CLEARFORMER_AVX512", "on")
    assert kernels_wanted() and avx512_in_use()
    assert resolve_method("auto", layout, device=cpu, head_dim=32).choice == "avx512"
    monkeypatch.setenv("CLEARFORMER_AVX512", "off")
    assert not kernels_wanted() and not avx512_in_use()
    assert resolve_method("auto", layout, device=cpu, head_dim=32).choice != "avx512"
    monkeypatch.setenv("CLEARFORMER_AVX512", "maybe")
    with pytest.raises(
        ValueError, match="CLEARFORMER_AVX512: expected 'on', 'off' or 'auto', got 'maybe'"
    ):
        kernels_wanted()


@pytest.mark.parametrize("is_causal", [False, True])
def test_varlen_by_name_equals_the_reference_and_sends_causal_rows_elsewhere(is_causal):
    q, k, v, cu = packed_qkv([3, 19, 40], heads=4, head_dim=32)
    layout = layout_from_cu_seqlens(cu.to(torch.int32))
    got = varlen_attention(q, k, v, layout, method="avx512", is_causal=is_causal)
    want = varlen_attention(q, k, v, layout, reference=True, is_causal=is_causal)
    torch.testing.assert_close(got, want, atol=2e-6, rtol=0)


def test_by_name_where_it_cannot_run_says_why(monkeypatch):
    monkeypatch.setattr(avx512, "_state", {"load": avx512.Decision("unavailable", "no compiler")})
    layout = layout_from_cu_seqlens(torch.tensor([0, 5], dtype=torch.int32))
    with pytest.raises(ValueError, match="method='avx512' cannot run here: no compiler"):
        resolve_method("avx512", layout, device=torch.device("cpu"), head_dim=32)


def test_an_encoder_gives_the_same_rows_with_it_padded_and_packed(preferred):
    torch.manual_seed(0)
    config = EncoderConfig(d_model=64, n_heads=2, n_layers=2, dim_mlp=128, dropout=0.0)
    encoder = Encoder(config).eval()
    x = torch.randn(4, 37, 64)
    mask = torch.arange(37) < torch.tensor([37, 20, 5, 30])[:, None]  # (B, T) ragged
    x_masked = x.masked_fill(~mask[..., None], 1e4)  # padded positions hold anything
    with torch.inference_mode():
        plan = encoder.plan_for(mask)
        assert plan.method is not None and plan.method.choice == "avx512"
        got = encoder(x_masked, mask)
        unmasked = encoder(x)  # no padding: the padded layout, through the same kernel
    with torch.inference_mode(), pytest.MonkeyPatch.context() as patch:
        patch.setenv("CLEARFORMER_AVX512", "off")  # PyTorch's kernels
        assert encoder.plan_for(mask).method.choice != "avx512"
        want = encoder(x, mask)
        want_unmasked = encoder(x)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=0)
    torch.testing.assert_close(unmasked, want_unmasked, atol=2e-5, rtol=0)
    assert (got[~mask] == 0).all()


def test_the_unmasked_padded_path_matches_sdpa(preferred):
    from clearformer.kernels.sdpa import sdpa_attention

    x = torch.randn(3, 50, 3, 2, 32)
    q, k, v = (t.transpose(1, 2) for t in x.unbind(2))  # (B, H, T, Dh) views
    got, _ = sdpa_attention(q, k, v, None)
    torch.testing.assert_close(got, F.scaled_dot_product_attention(q, k, v), atol=2e-6, rtol=0)


def test_encode_builds_it_only_for_large_calls(monkeypatch, preferred):
    from clearformer.text import encoder as text_encoder

    calls = []
    monkeypatch.setattr(avx512, "_state", {})
    not_built = avx512.Decision("not built", "a test")
    monkeypatch.setattr(avx512, "load", lambda build=True: calls.append(build) or not_built)
    text_encoder.attention_kernel_for(1_000, torch.device("cpu"))
    text_encoder.attention_kernel_for(avx512.BUILD_MIN_TOKENS, torch.device("cpu"))
    text_encoder.attention_kernel_for(avx512.BUILD_MIN_TOKENS, torch.device("meta"))
    assert calls == [True]  # built only for a call that repays it
    # A few long texts repay it too: attention grows with the square of their length.
    from clearformer import EncoderConfig
    from clearformer.text.kernel_builds import attention_work

    qwen3 = EncoderConfig(d_model=1024, n_heads=16, n_kv_heads=8, head_dim=128, n_layers=28)
    assert attention_work([8192], qwen3) >= avx512.BUILD_MIN_ATTENTION
    assert attention_work([2048] * 4, qwen3) < avx512.BUILD_MIN_ATTENTION
    assert attention_work([8192], None) == 0
    cpu = torch.device("cpu")
    text_encoder.attention_kernel_for(8192, cpu, attention=attention_work([2048] * 4, qwen3))
    assert calls == [True]
    text_encoder.attention_kernel_for(8192, cpu, attention=attention_work([8192], qwen3))
    assert calls == [True, True]


@torch.no_grad()
def test_a_built_kernel_is_taken_without_asking(preferred, monkeypatch):
    monkeypatch.setattr(avx512, "_state", {})  # a new process, the library built before
    layout = layout_from_cu_seqlens(torch.tensor([0, 5, 12], dtype=torch.int32))
    assert resolve_method("auto", layout, device=torch.device("cpu"), head_dim=32).choice == (
        "avx512"
    )
    assert avx512.is_loaded()


def test_a_second_process_loads_the_built_library_without_compiling(tmp_path):
    env = {**os.environ, "CLEARFORMER_CACHE": str(tmp_path)}
    # Prints what each load says, then how many builds ran (counted, not timed).
    script = (
        "from clearformer.fast import avx512; builds = []; build = avx512._build; "
        "avx512._build = lambda library: (builds.append(library), build(library))[1]; "
        "print(avx512.load(build=False).choice); "
        "print(avx512.load(build=True).choice); "
        "print(len(builds))"
    )
    first = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert first.stdout.split() == ["not", "built", "loaded", "1"], first.stderr
    (library,) = (tmp_path / "kernels").glob("avx512_kernels-*.so")
    assert library.stat().st_size > 0 and not list((tmp_path / "kernels").glob("tmp*"))
    again = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert again.stdout.split() == ["loaded", "loaded", "0"], again.stderr


def test_export_and_compile_trace_pytorchs_kernels_instead(preferred):
    torch.manual_seed(0)
    config = EncoderConfig(d_model=32, n_heads=2, n_layers=1, dim_mlp=64, dropout=0.0)
    encoder = Encoder(config).eval()
    x = torch.randn(2, 9, 32)
    with torch.no_grad():
        eager = encoder(x)  # unmasked: through the kernel
        program = torch.export.export(encoder, (x,))
        exported = program.module()(x)
    names = {str(node.target) for node in program.graph.nodes}
    assert not any("clearformer_avx512" in name for name in names)
    torch.testing.assert_close(exported, eager, atol=2e-5, rtol=0)


def planned_sdpa(q, k, v, keys, *, expect: str):
    """A lone layer's plan for (B, H, T, Dh) rows under the (B, T) key mask ``keys``, which
    must send its attention to ``expect`` (``avx512`` or ``torch``), run by the sdpa kernel."""
    from clearformer.kernels import KERNELS
    from clearformer.plan import plan_layer

    B, H, T, Dh = q.shape
    plan = plan_layer(keys, batch=B, heads=H, tq=T, tk=T, device=q.device, head_dim=Dh)
    assert plan.padded_route.choice == expect, plan.padded_route
    return KERNELS["sdpa"](q, k, v, plan, 0.0, None, None)


@pytest.mark.parametrize("padding", ["right", "left"])
def test_a_key_padding_mask_of_one_run_per_sequence_matches_sdpa(preferred, padding, monkeypatch):
    calls = []
    kernel = avx512.padded_attention
    monkeypatch.setattr(avx512, "padded_attention", lambda *a: calls.append(1) or kernel(*a))

    B, T = 4, 29
    x = torch.randn(B, T, 3, 2, 32)
    q, k, v = (t.transpose(1, 2) for t in x.unbind(2))  # (B, H, T, Dh) views
    counts = torch.tensor([29, 17, 1, 8])
    keys = torch.arange(T) < counts[:, None]  # (B, T), right-padded
    if padding == "left":
        keys = keys.flip(-1)
    mask = keys[:, None, None, :]  # (B, 1, 1, T)
    with torch.no_grad():
        got, _ = planned_sdpa(q, k, v, keys, expect="avx512")
    exact = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask)
    torch.testing.assert_close(got.double(), exact, atol=2e-6, rtol=0)  # padded queries too
    assert calls == [1]  # through the kernel


def test_keys_with_holes_go_to_pytorchs_kernel(preferred, monkeypatch):
    calls = []
    monkeypatch.setattr(avx512, "padded_attention", lambda *a: calls.append(a))
    x = torch.randn(2, 10, 3, 2, 32)
    q, k, v = (t.transpose(1, 2) for t in x.unbind(2))
    keys = torch.ones(2, 10, dtype=torch.bool)
    keys[1, 4] = False  # a hole: not one run
    with torch.no_grad():
        got, _ = planned_sdpa(q, k, v, keys, expect="torch")
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=keys[:, None, None, :])
    assert calls == []
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def test_encode_with_it_gives_the_embeddings_of_pytorchs_kernels(preferred, monkeypatch):
    from clearformer import TextEncoder

    encoder = TextEncoder.from_pretrained()
    texts = [f"sentence {i} " + "word " * (3 * i % 70) for i in range(40)]  # ragged, packed
    texts += ["the same length"] * 4  # and a batch of equal lengths
    with_kernel = encoder.encode(texts, progress=False)
    monkeypatch.setenv("CLEARFORMER_AVX512", "off")
    without = encoder.encode(texts, progress=False)
    np.testing.assert_allclose(with_kernel, without, atol=1e-5, rtol=0)
