"""clearformer's flash kernels, float32 (AVX-512) and bfloat16 (AVX512-BF16): causal or
bidirectional, local or global attention with grouped keys and values, against the float64
formula, with masks that mask, and each taken by ``auto`` on a verdict of its own."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from clearformer import Encoder, EncoderConfig, routes
from clearformer.fast import avx512
from clearformer.padding import layout_from_cu_seqlens
from clearformer.ran import watching

from .helpers import needs_avx512_library

pytestmark = needs_avx512_library
# The bfloat16 kernel's tests run its instructions: on CPUs with AVX512-BF16 only.
needs_bf16 = pytest.mark.skipif(not avx512.bf16_products(), reason="this CPU has no AVX512-BF16")
DTYPES = [
    pytest.param(torch.float32, id="float32"),
    pytest.param(torch.bfloat16, marks=needs_bf16, id="bf16"),
]

# bfloat16: output rounding (2^-8 of a value near 1) plus the probabilities' own rounding
# before the second product, two steps; float32: sums in another order than float64's.
BF16_STEPS = 2**-7
STEPS = {torch.bfloat16: BF16_STEPS, torch.float32: 2e-6}


def grouped_rows(lengths, heads, kv_heads, head_dim, seed=0, apart=True, dtype=torch.bfloat16):
    """q (N, H, Dh), k and v (N, Hkv, Dh) of ``dtype`` as a rotary model's attention gets them:
    queries and keys new tensors, values a strided view of the projection's rows (``apart``);
    else all three views of one projection. Returns q, k, v, cu_seqlens."""
    g = torch.Generator().manual_seed(seed)
    n = sum(lengths)
    width = (heads + 2 * kv_heads) * head_dim
    rows = torch.randn(n, width, generator=g).to(dtype)  # (N, (H + 2 Hkv) Dh)
    q = rows[:, : heads * head_dim].view(n, heads, head_dim)
    k = rows[:, heads * head_dim : (heads + kv_heads) * head_dim].view(n, kv_heads, head_dim)
    v = rows[:, (heads + kv_heads) * head_dim :].view(n, kv_heads, head_dim)
    if apart:
        q, k = q.clone(), k.clone()
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64)
    return q, k, v, cu


def reference(q, k, v, cu, scale, causal):
    """softmax(q k^T scale) v per sequence in float64, each query head on its group's keys."""
    group = q.shape[1] // k.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float64)
    for lo, hi in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        if hi == lo:
            continue
        qs = q[lo:hi].double().transpose(0, 1)  # (H, L, Dh)
        ks, vs = (t[lo:hi].double().repeat_interleave(group, 1).transpose(0, 1) for t in (k, v))
        scores = qs @ ks.transpose(1, 2) * scale  # (H, L, L)
        if causal:
            future = torch.ones(hi - lo, hi - lo, dtype=torch.bool).triu(1)
            scores = scores.masked_fill(future, float("-inf"))
        out[lo:hi] = (torch.softmax(scores, -1) @ vs).transpose(0, 1)
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim"), [(4, 4, 32), (4, 2, 64), (8, 1, 128), (3, 1, 256)]
)
def test_every_length_matches_the_float64_formula(causal, heads, kv_heads, head_dim, dtype):
    # Lengths on both sides of the 32-key tiles, the 8-query register blocks, the 64-query
    # tasks and the 128-key softmax steps, and an empty sequence.
    lengths = [1, 2, 7, 8, 9, 31, 32, 33, 0, 64, 65, 127, 128, 129, 300]
    q, k, v, cu = grouped_rows(lengths, heads, kv_heads, head_dim, dtype=dtype)
    scale = head_dim**-0.5
    got = avx512.flash_attention(q, k, v, cu, scale, causal)
    assert got.dtype == dtype and got.shape == q.shape
    want = reference(q, k, v, cu, scale, causal)
    torch.testing.assert_close(got.double(), want, atol=STEPS[dtype], rtol=STEPS[dtype])


def band_reference(q, k, v, cu, scale, causal, window):
    """:func:`reference` where token i sees tokens j with |i - j| <= window only."""
    group = q.shape[1] // k.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float64)
    for lo, hi in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        if hi == lo:
            continue
        qs = q[lo:hi].double().transpose(0, 1)  # (H, L, Dh)
        ks, vs = (t[lo:hi].double().repeat_interleave(group, 1).transpose(0, 1) for t in (k, v))
        i = torch.arange(hi - lo)
        allowed = (i[None, :] - i[:, None]).abs() <= window  # (L, L)
        if causal:
            allowed &= i[None, :] <= i[:, None]
        scores = (qs @ ks.transpose(1, 2) * scale).masked_fill(~allowed, float("-inf"))
        out[lo:hi] = (torch.softmax(scores, -1) @ vs).transpose(0, 1)
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window", [0, 1, 5, 31, 32, 100, 1000])
def test_a_window_matches_the_banded_formula(causal, window, dtype):
    # Peaked scores: a key one step outside the window moves an output by about a value.
    lengths = [1, 7, 33, 0, 129, 300]
    q, k, v, cu = grouped_rows(lengths, heads=4, kv_heads=2, head_dim=64, dtype=dtype)
    q = (q.float() * 3).to(dtype)
    got = avx512.flash_attention(q, k, v, cu, 0.125, causal, window)
    want = band_reference(q, k, v, cu, 0.125, causal, window)
    torch.testing.assert_close(got.double(), want, atol=2 * STEPS[dtype], rtol=STEPS[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_keys_beyond_the_window_never_move_a_query(dtype):
    q, k, v, cu = grouped_rows([200], heads=4, kv_heads=2, head_dim=64, seed=6, dtype=dtype)
    got = avx512.flash_attention(q, k, v, cu, 0.125, False, 20)
    spoiled = [t.clone() for t in (q, k)]
    for t in spoiled:
        t[:80] = float("nan")  # rows 0..79: beyond the window of rows 100..
        t[121 + 20 :] = float("inf")  # and after it, for rows ..120
    changed = avx512.flash_attention(*spoiled, v, cu, 0.125, False, 20)
    assert torch.equal(changed[100:121], got[100:121])


@pytest.mark.parametrize("dtype", DTYPES)
def test_peaked_scores_show_every_mask_exactly(dtype):
    # Large scores make each query's attention nearly one key: a key seen that should not be
    # (one step too far, another sequence's) moves an output by about a whole value.
    lengths = [1, 5, 40, 33, 130]
    q, k, v, cu = grouped_rows(lengths, heads=4, kv_heads=2, head_dim=64, seed=3, dtype=dtype)
    q = (q.float() * 4).to(dtype)
    for causal in (True, False):
        got = avx512.flash_attention(q, k, v, cu, 0.5, causal)
        want = reference(q, k, v, cu, 0.5, causal)
        # Scores of about 50 carry float32 rounding of 1e-5 into the weights; a key wrongly
        # seen or missed moves an output by about a whole value.
        steps = 2 * BF16_STEPS if dtype == torch.bfloat16 else 1e-4
        torch.testing.assert_close(got.double(), want, atol=steps, rtol=steps)


@pytest.mark.parametrize("dtype", DTYPES)
def test_keys_after_a_query_never_move_it_whatever_they_hold(dtype):
    q, k, v, cu = grouped_rows([100], heads=4, kv_heads=2, head_dim=64, seed=1, dtype=dtype)
    got = avx512.flash_attention(q, k, v, cu, 0.125, True)
    spoiled = [t.clone() for t in (q, k, v)]
    for t, value in zip(spoiled, (float("nan"), float("inf"), 3e38), strict=True):
        t[60:] = value  # rows 60.. : the future of rows 0..59
    changed = avx512.flash_attention(*spoiled, cu, 0.125, True)
    assert torch.equal(changed[:60], got[:60])
    assert not torch.equal(changed[60:], got[60:])  # the spoiled rows did take part


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [True, False])
def test_a_sequence_alone_equals_its_rows_in_a_batch(causal, dtype):
    lengths = [50, 70, 3]
    q, k, v, cu = grouped_rows(lengths, heads=4, kv_heads=2, head_dim=64, seed=2, dtype=dtype)
    together = avx512.flash_attention(q, k, v, cu, 0.125, causal)
    for lo, hi in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        rows = [t[lo:hi].contiguous() for t in (q, k, v)]  # other strides, the same values
        alone = avx512.flash_attention(*rows, torch.tensor([0, hi - lo]), 0.125, causal)
        assert torch.equal(alone, together[lo:hi])
    # Neighbours holding anything leave a sequence's rows as they were.
    spoiled = [t.clone() for t in (q, k, v)]
    for t in spoiled:
        t[: cu[1]] = float("nan")
        t[cu[2] :] = float("inf")
    middle = slice(int(cu[1]), int(cu[2]))
    assert torch.equal(
        avx512.flash_attention(*spoiled, cu, 0.125, causal)[middle], together[middle]
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_grouped_heads_equal_their_keys_repeated_bit_for_bit(dtype):
    q, k, v, cu = grouped_rows([9, 140], heads=8, kv_heads=2, head_dim=64, seed=4, dtype=dtype)
    grouped = avx512.flash_attention(q, k, v, cu, 0.125, True)
    repeated = [t.repeat_interleave(4, 1) for t in (k, v)]  # (N, H, Dh): one per query head
    assert torch.equal(avx512.flash_attention(q, *repeated, cu, 0.125, True), grouped)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_thread_count_does_not_change_a_bit(dtype):
    q, k, v, cu = grouped_rows([3, 200, 77], heads=4, kv_heads=2, head_dim=64, seed=5, dtype=dtype)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = avx512.flash_attention(q, k, v, cu, 0.125, True)
        torch.set_num_threads(max(threads, 2))
        several = avx512.flash_attention(q, k, v, cu, 0.125, True)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, several)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_it_cannot_read_are_refused_by_name(dtype):
    q, k, v, cu = grouped_rows([4], heads=2, kv_heads=1, head_dim=48, dtype=dtype)
    assert not avx512.flash_serves(q, k, v)
    with pytest.raises(RuntimeError, match="multiple of 32, got 48"):
        avx512.flash_attention(q, k, v, cu, 1.0, True)
    q, k, v, cu = grouped_rows([4], heads=2, kv_heads=1, head_dim=32, dtype=dtype)
    with pytest.raises(ValueError, match="window must be >= 0 .*got -2"):
        avx512.flash_attention(q, k, v, cu, 1.0, True, -2)
    assert avx512.flash_serves(q, k, v)
    assert not avx512.flash_serves(q.half(), k.half(), v.half())
    with pytest.raises(TypeError, match="float32 or bfloat16"):
        avx512.flash_attention(q.half(), k.half(), v.half(), cu, 1.0, True)
    other = torch.float32 if dtype == torch.bfloat16 else torch.bfloat16
    assert not avx512.flash_serves(q, k.to(other), v)  # one dtype for the three
    with pytest.raises(RuntimeError, match=r"key/value heads \(3\) must divide query heads \(2\)"):
        rows = grouped_rows([4], 3, 3, 32, dtype=dtype)[1:3]
        avx512.flash_attention(q, *rows, cu, 1.0, True)
    with pytest.raises(RuntimeError, match="end at N = 4, got 0 and 3"):  # rows no one holds
        avx512.flash_attention(q, k, v, torch.tensor([0, 3]), 1.0, True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_values_wider_than_the_keys_and_empty_rows_keep_pytorchs_kernel(monkeypatch, dtype):
    from clearformer import MultiHeadAttention

    monkeypatch.setenv("CLEARFORMER_AVX512", "on")
    torch.manual_seed(0)
    mha = MultiHeadAttention(64, 64, 128, 64, 2, 0.0, backend="sdpa").eval().to(dtype)
    x = torch.randn(2, 40, 64, dtype=dtype)
    empty = x[:, :0]
    with torch.inference_mode():
        got, _ = mha(x, is_causal=True)
        none, _ = mha(empty, is_causal=True)
        monkeypatch.setenv("CLEARFORMER_AVX512", "off")
        want, _ = mha(x, is_causal=True)
    assert torch.equal(got, want) and none.shape == (2, 0, 64)


def call(causal=True, grouped=True, dtype=torch.bfloat16, head_dim=64):
    return routes.VarlenCall(
        torch.device("cpu"), dtype, head_dim, causal, grouped=grouped, rows_apart=True
    )


@torch.no_grad()
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("speed", [1.5, 0.8])
def test_auto_takes_it_on_its_own_verdict(measured, speed, dtype):
    # Each dtype's flash kernel on its own verdict; the other one's says the opposite.
    kernel = avx512.flash_kernel(dtype)
    other = avx512.flash_kernel(torch.float32 if dtype == torch.bfloat16 else torch.bfloat16)
    speeds = {kernel: speed, other: 1 / speed}
    measured(avx512_attention=0.5, avx512_attention_bf16=0.5, **speeds)
    layout = layout_from_cu_seqlens(torch.tensor([0, 5, 12, 20], dtype=torch.int32))
    method = routes.varlen_method(layout, call(dtype=dtype))
    assert (method.choice == "avx512") == (speed > 1), method
    label = "AVX512-BF16 flash" if dtype == torch.bfloat16 else "AVX-512 flash attention (float32)"
    assert label in routes.kernel_route(kernel).reason


def test_heads_it_cannot_take_and_cpus_without_bf16_products_keep_pytorch(monkeypatch):
    monkeypatch.setenv("CLEARFORMER_AVX512", "on")
    monkeypatch.setattr(avx512, "bf16_products", lambda: True)
    assert routes.attention_kernel_for(call())[1].choice == "serves"
    assert routes.attention_kernel_for(call(head_dim=48))[1].choice == "declines"
    wider = routes.VarlenCall(torch.device("cpu"), torch.bfloat16, 64, True, value_dim=128)
    assert "as wide as the keys" in routes.attention_kernel_for(wider)[1].reason
    monkeypatch.setattr(avx512, "bf16_products", lambda: False)
    kernel, served = routes.attention_kernel_for(call())
    assert kernel == "avx512_flash_bf16" and "AVX512-BF16" in served.reason
    assert "no AVX512-BF16" in routes.kernel_route(kernel).reason
    assert "avx512_flash_bf16" not in avx512.kernels_here()
    q, k, v, cu = grouped_rows([4], heads=2, kv_heads=1, head_dim=32)
    assert not avx512.flash_serves(q, k, v)
    with pytest.raises(RuntimeError, match="needs AVX512-BF16"):  # before any instruction
        avx512.flash_attention(q, k, v, cu, 1.0, True)
    # float32 rows need AVX-512 alone: served still.
    assert "avx512_flash" in avx512.kernels_here()
    kernel, served = routes.attention_kernel_for(call(dtype=torch.float32))
    assert kernel == "avx512_flash" and served.choice == "serves"
    assert avx512.flash_serves(q.float(), k.float(), v.float())


def grouped_encoder(seed=0, **overrides) -> Encoder:
    """A two-layer pre-norm encoder with grouped keys, per-head norms and rotary positions
    (Qwen3's and EmbeddingGemma's kind of layer), causal unless ``overrides`` say otherwise."""
    torch.manual_seed(seed)
    fields = dict(
        d_model=128,
        n_heads=4,
        n_kv_heads=2,
        head_dim=64,
        n_layers=2,
        dim_mlp=256,
        dropout=0.0,
        norm="pre",
        norm_kind="rms",
        activation="swiglu",
        bias=False,
        qk_norm=True,
        causal=True,
        positions="rotary",
    )
    return Encoder(EncoderConfig(**{**fields, **overrides})).eval()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ragged", [True, False])
@pytest.mark.parametrize("causal", [False, True])
def test_local_and_global_layers_run_on_it(monkeypatch, ragged, dtype, causal):
    # EmbeddingGemma's pattern: a local layer (|i - j| <= 8 here) and a global one, grouped
    # keys, rotary, bidirectional (and a decoder's, causal); ragged rows packed, rows of one
    # length padded. The padded plan folds a short local layer's causal triangle into a mask
    # the flash kernel does not read: the kernel must still apply it.
    encoder = grouped_encoder(
        1,
        n_heads=2,
        n_kv_heads=1,
        causal=causal,
        local_window=16,
        layer_pattern=("local", "global"),
    )
    lengths = [70, 33, 5, 70] if ragged else [70] * 4
    mask = torch.arange(70) < torch.tensor(lengths)[:, None]  # (B, T)
    x = torch.randn(4, 70, 128)
    calls = []
    kernel = avx512.flash_attention
    monkeypatch.setattr(avx512, "flash_attention", lambda *a: calls.append(a[-1]) or kernel(*a))
    with torch.inference_mode():
        monkeypatch.setenv("CLEARFORMER_AVX512", "off")
        want = encoder(x, mask)  # float32 on PyTorch's kernels
        model = encoder.to(dtype)
        pytorch = model(x.to(dtype), mask)
        monkeypatch.setenv("CLEARFORMER_AVX512", "on")
        got = model(x.to(dtype), mask)
    # The local layer's window (8 each side; a causal one looks back 15), then the global one.
    assert calls == [15 if causal else 8, None]
    assert_as_close_as_pytorch(got[mask], pytorch[mask], want[mask])


def assert_as_close_as_pytorch(got, pytorch, want):
    """float32 rows: equal to the float32 encoder within float rounding; bfloat16 ones: as
    close to it by cosine as PyTorch's bfloat16 attention."""
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
        return
    ours = F.cosine_similarity(got.float(), want, dim=-1)
    theirs = F.cosine_similarity(pytorch.float(), want, dim=-1)
    assert ours.min() > 0.999 and ours.min() > theirs.min() - 1e-3


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ragged", [True, False])
def test_a_causal_grouped_encoder_runs_on_it_at_pytorchs_accuracy(monkeypatch, ragged, dtype):
    # Ragged rows take the packed path, rows of one length the padded one: both reach the
    # kernel: float32 equal to the float32 encoder, bfloat16 as close to it as PyTorch's.
    encoder = grouped_encoder()
    lengths = [70, 33, 5, 70] if ragged else [70] * 4
    mask = torch.arange(70) < torch.tensor(lengths)[:, None]  # (B, T)
    x = torch.randn(4, 70, 128)
    x_masked = x.masked_fill(~mask[..., None], 1e4)  # padded positions hold anything
    calls = []
    kernel = avx512.flash_attention
    monkeypatch.setattr(avx512, "flash_attention", lambda *a: calls.append(1) or kernel(*a))
    with torch.inference_mode():
        monkeypatch.setenv("CLEARFORMER_AVX512", "off")
        want = encoder(x, mask)  # float32 on PyTorch's kernels
        model = encoder.to(dtype)
        pytorch = model(x.to(dtype), mask)
        monkeypatch.setenv("CLEARFORMER_AVX512", "on")
        with watching() as notes:
            got = model(x_masked.to(dtype), mask)
        assert len(calls) == 2 and ("attention", "avx512") in notes  # one call per layer
    assert_as_close_as_pytorch(got[mask], pytorch[mask], want[mask])
    assert (got[~mask] == 0).all()


@torch.no_grad()
@pytest.mark.parametrize("flash_speed", [0.5, 1.5])
def test_rows_of_another_layout_reach_the_flash_kernel_on_its_own_verdict(
    measured, monkeypatch, flash_speed
):
    # Cross-attention over memory as long as the queries: the plan asks the AVX-512 kernel's
    # verdict (plain rows), the rows turn out apart (q from the queries, k and v from the
    # memory); the flash kernel then takes them only where its own verdict says so.
    from clearformer import MultiHeadAttention

    measured(avx512_attention=1.5, avx512_flash=flash_speed)
    torch.manual_seed(0)
    mha = MultiHeadAttention(64, 64, 64, 64, 2, 0.0, backend="sdpa", cross=True).eval()
    x, memory = torch.randn(2, 30, 64), torch.randn(2, 30, 64)
    calls = []
    kernel = avx512.flash_attention
    monkeypatch.setattr(avx512, "flash_attention", lambda *a: calls.append(1) or kernel(*a))
    got, _ = mha(x, memory)
    monkeypatch.setenv("CLEARFORMER_AVX512", "off")
    want, _ = mha(x, memory)
    assert bool(calls) == (flash_speed > 1)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
