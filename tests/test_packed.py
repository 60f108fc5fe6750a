"""Packed execution gives the padded results: forward and gradients, every varlen method."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from clearformer import Encoder, EncoderConfig, MultiHeadAttention
from clearformer.bench.varlen_methods import bench_varlen_attention, length_buckets
from clearformer.packed_attention import varlen_attention
from clearformer.padding import pack_layout, repad, unpad
from clearformer.plan import PACK_MIN_PADDING

from .helpers import intra_op_threads, lengths_mask

# A single real token, an empty sequence, a full row and ragged ones.
LENGTHS = [1, 0, 9, 4, 2]
METHODS = ("sequence", "padded", "threads", "bucket", "nested")  # the kernel's, the benchmark's two
D, H = 32, 4


def twin_encoders(norm: str, activation: str, **packed_options) -> tuple[Encoder, Encoder]:
    """The same weights twice: the math reference on the padded layout, and a packed stack."""
    common = dict(d_model=D, n_heads=H, n_layers=2, dim_mlp=64, norm=norm, activation=activation)
    reference = Encoder(EncoderConfig(**common, backend="math"))
    packed = Encoder(EncoderConfig(**common, **packed_options))
    packed.load_state_dict(reference.state_dict())
    with torch.no_grad():  # non-trivial norms, so that a misplaced norm would show
        for model in (reference, packed):
            torch.manual_seed(1)
            for name, p in model.named_parameters():
                if "norm" in name:
                    p.uniform_(0.5, 1.5)
    return reference, packed


def test_layout_and_round_trip():
    mask = lengths_mask(LENGTHS)
    x = torch.randn(len(LENGTHS), mask.shape[1], D)
    rows, layout = unpad(x, mask)
    assert rows.shape == (sum(LENGTHS), D)
    assert layout.cu_seqlens.tolist() == [0, 1, 1, 10, 14, 16]
    assert layout.lengths == LENGTHS and layout.max_seqlen == 9
    back = repad(rows, layout)
    torch.testing.assert_close(back[mask], x[mask], rtol=0, atol=0)
    assert (back[~mask] == 0).all()


def test_layout_of_empty_batch_and_no_tokens():
    layout = pack_layout(torch.zeros(3, 4, dtype=torch.bool))
    assert layout.num_tokens == 0 and layout.max_seqlen == 0
    out = repad(torch.zeros(0, D), layout)
    assert out.shape == (3, 4, D) and (out == 0).all()


@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize(
    "options",
    [{}, {"backend": "varlen"}, {"backend": "varlen", "checkpointing": True}],
)
def test_packed_stack_matches_math_forward_and_gradients(norm, activation, options):
    reference, packed = twin_encoders(norm, activation, **options)
    mask = lengths_mask(LENGTHS)
    assert packed.plan_for(mask).packed and not reference.plan_for(mask).packed
    x = torch.randn(len(LENGTHS), mask.shape[1], D)
    x_ref, x_packed = x.clone().requires_grad_(), x.clone().requires_grad_()
    for model in (reference, packed):
        model.train()  # dropout is 0: training mode must give the same numbers
    out_ref, out_packed = reference(x_ref, mask), packed(x_packed, mask)
    torch.testing.assert_close(out_packed[mask], out_ref[mask], atol=1e-5, rtol=1e-5)
    assert (out_packed[~mask] == 0).all() and (out_ref[~mask] == 0).all()

    weight = torch.randn_like(out_ref)
    (out_ref * weight).sum().backward()
    (out_packed * weight).sum().backward()
    torch.testing.assert_close(x_packed.grad, x_ref.grad, atol=1e-5, rtol=1e-5)
    assert (x_packed.grad[~mask] == 0).all()
    for (name, a), (_, b) in zip(
        reference.named_parameters(), packed.named_parameters(), strict=True
    ):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-5, rtol=1e-5, msg=name)


def test_auto_packs_only_when_padding_pays():
    _, auto = twin_encoders("pre", "relu")
    assert not auto.plan_for(None, shape=(2, 40), device=torch.device("cpu")).packed
    full = torch.ones(2, 40, dtype=torch.bool)
    assert not auto.plan_for(full).packed
    barely = full.clone()
    barely[0, -1] = False  # 1 / 80 padding, below the threshold
    assert PACK_MIN_PADDING > 1 / 80 and not auto.plan_for(barely).packed
    assert auto.plan_for(lengths_mask(LENGTHS)).packed
    assert "padding" in str(auto.plan_for(lengths_mask(LENGTHS)).layout)


def test_full_mask_equals_no_mask():
    _, auto = twin_encoders("post", "gelu")
    auto.eval()
    x = torch.randn(2, 5, D)
    with torch.no_grad():
        torch.testing.assert_close(auto(x, torch.ones(2, 5, dtype=torch.bool)), auto(x))


def test_varlen_backend_without_mask_runs_packed():
    reference, packed = twin_encoders("pre", "relu", backend="varlen")
    x = torch.randn(2, 6, D)
    with torch.no_grad():
        torch.testing.assert_close(packed(x), reference(x), atol=1e-5, rtol=1e-5)


def packed_qkv(lengths, Dh=8, dtype=torch.float32):
    N = sum(lengths)
    q, k, v = (torch.randn(N, H, Dh, dtype=dtype, requires_grad=True) for _ in range(3))
    _, layout = unpad(torch.zeros(len(lengths), max(max(lengths), 1), 1), lengths_mask(lengths))
    return q, k, v, layout


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("is_causal", [False, True])
def test_varlen_methods_match_reference(method, is_causal):
    if method == "nested" and is_causal:
        pytest.skip("jagged nested SDPA has no causal mode (rejected, see the next test)")
    lengths = LENGTHS
    q, k, v, layout = packed_qkv(lengths)
    want = varlen_attention(q, k, v, layout, is_causal=is_causal, reference=True)
    if method in ("bucket", "nested"):
        got = bench_varlen_attention(q, k, v, layout, is_causal=is_causal, method=method)
    else:
        got = varlen_attention(q, k, v, layout, is_causal=is_causal, method=method)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    grads_want = torch.autograd.grad(want.square().sum(), (q, k, v))
    grads_got = torch.autograd.grad(got.square().sum(), (q, k, v))
    for a, b in zip(grads_got, grads_want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_length_buckets_bound_the_padding():
    lengths = [5, 0, 100, 7, 98, 6, 50]
    groups = length_buckets(lengths, waste=0.1)
    assert sorted(b for g in groups for b in g) == [0, 2, 3, 4, 5, 6]  # empty one left out
    for group in groups:
        real = sum(lengths[b] for b in group)
        assert len(group) * max(lengths[b] for b in group) <= 1.1 * real


def test_varlen_rejects_unknown_method():
    q, k, v, layout = packed_qkv([2, 3])
    with pytest.raises(ValueError, match="method must be one of"):
        varlen_attention(q, k, v, layout, method="fast")
    with pytest.raises(ValueError, match="method='flash' needs CUDA"):
        varlen_attention(q, k, v, layout, method="flash")
    with pytest.raises(ValueError, match="method must be one of"):
        varlen_attention(q, k, v, layout, method="nested")  # the benchmark's, not the kernel's
    with pytest.raises(ValueError, match="'nested' does not support is_causal"):
        bench_varlen_attention(q, k, v, layout, method="nested", is_causal=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_packed_half_precision_is_finite_with_empty_rows(dtype):
    _, packed = twin_encoders("pre", "gelu", backend="varlen")
    packed = packed.to(dtype).eval()
    mask = lengths_mask(LENGTHS)
    x = torch.randn(len(LENGTHS), mask.shape[1], D, dtype=dtype)
    with torch.no_grad():
        out = packed(x, mask)
    assert out.dtype == dtype and torch.isfinite(out).all() and (out[~mask] == 0).all()


@pytest.mark.parametrize("options", [{"backend": "varlen"}, {"backend": "sdpa"}])
def test_autocast_bf16_is_close_to_float32(options):
    reference, packed = twin_encoders("post", "gelu", **options)
    mask = lengths_mask(LENGTHS)
    x = torch.randn(len(LENGTHS), mask.shape[1], D)
    with torch.no_grad():
        want = reference.eval()(x, mask)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = packed.eval()(x, mask)
    assert torch.isfinite(got).all() and (got[~mask] == 0).all()
    torch.testing.assert_close(got.float()[mask], want[mask], atol=0.1, rtol=0.05)


def test_mha_packed_rows_match_padded_math():
    attn = MultiHeadAttention(D, D, D, D, H, backend="math").eval()
    mask = lengths_mask(LENGTHS)
    x = torch.randn(len(LENGTHS), mask.shape[1], D)
    rows, layout = unpad(x, mask)
    with torch.no_grad():
        want, _ = attn(x, mask=mask)
        got, _ = attn(rows, layout=layout, backend="auto")
    torch.testing.assert_close(repad(got, layout)[mask], want[mask], atol=1e-5, rtol=1e-5)


@given(
    lengths=st.lists(st.integers(min_value=0, max_value=9), min_size=1, max_size=5),
    extra=st.integers(min_value=0, max_value=3),
    norm=st.sampled_from(["pre", "post"]),
)
def test_packed_matches_padded_for_any_lengths(lengths, extra, norm):
    reference, packed = twin_encoders(norm, "relu", backend="varlen")
    mask = lengths_mask(lengths, max(lengths) + extra if max(lengths) + extra > 0 else 1)
    x = torch.randn(len(lengths), mask.shape[1], D)
    with torch.no_grad():
        want, got = reference(x, mask), packed(x, mask)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert torch.isfinite(got).all()


def test_equal_length_runs_merge_only_neighbours():
    from clearformer.fast.varlen import equal_length_runs

    # lengths 3, 3, 0, 3, 5, 5, 3: an empty sequence has no rows, so it does not split a run
    offsets = (0, 3, 6, 6, 9, 14, 19, 22)
    assert equal_length_runs(offsets) == [(0, 3, 3), (9, 2, 5), (19, 1, 3)]


def test_runs_of_equal_lengths_match_reference():
    q, k, v, layout = packed_qkv([4, 4, 4, 0, 2, 2, 5])
    want = varlen_attention(q, k, v, layout, reference=True)
    got = varlen_attention(q, k, v, layout, method="sequence")
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_auto_method_bounds_the_number_of_calls():
    from clearformer.routes import MAX_SEQUENCE_CALLS

    from .helpers import resolve_method

    q, _, _, few = packed_qkv([5, 5, 5, 5, 3])  # two runs: two calls
    lengths = [2 + (i % 2) for i in range(MAX_SEQUENCE_CALLS + 1)]  # no two neighbours equal
    _, _, _, many = packed_qkv(lengths)
    cpu, meta = q.device, torch.device("meta")
    _, _, _, one = packed_qkv([4, 4, 4])  # one run: one call, nothing to group
    with intra_op_threads(2):
        # On CPU the runs are grouped per thread, however many there are.
        assert resolve_method("auto", few, device=cpu).choice == "threads"
        assert resolve_method("auto", many, device=cpu).choice == "threads"
        assert resolve_method("auto", one, device=cpu).choice == "sequence"
        # Elsewhere (no flash_attn) the number of calls decides.
        assert resolve_method("auto", few, device=meta).choice == "sequence"
        assert resolve_method("auto", many, device=meta).choice == "padded"
        assert str(MAX_SEQUENCE_CALLS) in resolve_method("auto", many, device=meta).reason
    with intra_op_threads(1):  # no parallel region to wait for: one call per run
        assert resolve_method("auto", many, device=cpu).choice == "sequence"
        # the CPU's thread count says nothing about an accelerator's kernels
        assert resolve_method("auto", many, device=meta).choice == "padded"


def test_many_sequences_through_padded_attention_match_math():
    # More sequences than MAX_SEQUENCE_CALLS: auto attends on a padded copy inside the packed
    # stack. Forward and gradients must still equal the reference.
    lengths = [3, 0, 1, 7, 2, 5, 5, 1, 6, 4, 2, 7]
    reference, packed = twin_encoders("post", "gelu", backend="varlen")
    mask = lengths_mask(lengths)
    x = torch.randn(len(lengths), mask.shape[1], D)
    x_ref, x_packed = x.clone().requires_grad_(), x.clone().requires_grad_()
    with intra_op_threads(2):  # with one thread auto calls per sequence instead
        out_ref, out_packed = reference(x_ref, mask), packed(x_packed, mask)
    torch.testing.assert_close(out_packed, out_ref, atol=1e-5, rtol=1e-5)
    out_ref.square().sum().backward()
    out_packed.square().sum().backward()
    torch.testing.assert_close(x_packed.grad, x_ref.grad, atol=1e-5, rtol=1e-5)
