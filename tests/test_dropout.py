"""Dropout with counter-based masks (clearformer.dropout, clearformer.philox and the AVX-512
kernel): the generator against Random123's published vectors, the kernel against the
generator bit for bit, and the module against PyTorch's dropout's definition."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
import torch.nn.functional as F

from clearformer import Encoder, EncoderConfig, philox, routes
from clearformer.dropout import Dropout, counter_masks, dropout
from clearformer.fast import avx512, varlen
from clearformer.fast.counter_dropout import counter_masks_serve
from clearformer.fast.sdpa_call import _written_out
from clearformer.machine import machine
from clearformer.packed_attention import varlen_attention
from clearformer.padding import layout_from_cu_seqlens
from clearformer.reference import scaled_dot_product

# Random123's known-answer vectors for Philox4x32-10 (tests/kat_vectors of the Random123
# distribution): counter words, key words, output words.
KNOWN_ANSWERS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]

needs_kernel = pytest.mark.skipif(
    not machine().avx512_available, reason="needs an AVX-512 CPU with a C++ compiler"
)


@pytest.fixture
def kernel_on():
    """Counter-based masks asked for, with the library built and loaded."""
    if avx512.load(build=True).choice != "loaded":
        pytest.skip("the AVX-512 library could not be built here")
    with counter_masks():
        yield


@pytest.mark.parametrize("counter, key, expected", KNOWN_ANSWERS)
def test_philox_matches_random123_known_answers(counter, key, expected):
    words = philox.philox4x32(tuple(torch.tensor([c]) for c in counter), key)
    assert tuple(int(w) for w in words) == expected


def test_mask_words_follow_the_documented_order():
    seed = 0x0123456789ABCDEF
    words = philox.mask_words(seed, 300)
    for i in (0, 1, 15, 16, 17, 63, 64, 100, 299):
        block = (i // 64) * 16 + i % 16
        one = philox.philox4x32(
            (torch.tensor([block]), torch.tensor([0]), torch.tensor([0]), torch.tensor([0])),
            (seed & 0xFFFFFFFF, seed >> 32),
        )
        assert int(words[i]) == int(one[(i % 64) // 16]), i


def test_mask_words_refuse_a_seed_outside_64_bits():
    with pytest.raises(ValueError, match="seed must be in"):
        philox.mask_words(-1, 4)


def _expected(x: torch.Tensor, seed: int, threshold: int, scale: float) -> torch.Tensor:
    words = philox.mask_words(seed, x.numel()).view(x.shape)
    factor = torch.where(words >= threshold, torch.tensor(scale), torch.tensor(0.0))
    return (x.float() * factor).to(x.dtype)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bf16"])
@pytest.mark.parametrize("count", [1, 15, 16, 17, 63, 64, 65, 1000, 4099])
def test_kernel_equals_the_generator_bit_for_bit(kernel_on, dtype, count):
    x = torch.randn(count).to(dtype)
    seed, threshold = 2**62 + 12345, round(0.3 * 2**32)
    out = avx512.counter_dropout(x, seed, threshold, 1 / 0.7)
    assert torch.equal(out, _expected(x, seed, threshold, 1 / 0.7))


@needs_kernel
def test_kernel_result_does_not_depend_on_the_thread_count(kernel_on):
    x = torch.randn(3, 700_001)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = avx512.counter_dropout(x, 7, round(0.1 * 2**32), 1.25)
        torch.set_num_threads(max(threads, 2))
        several = avx512.counter_dropout(x, 7, round(0.1 * 2**32), 1.25)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, several)


@needs_kernel
def test_kernel_reads_strided_input(kernel_on):
    x = torch.randn(40, 30).t()  # not contiguous
    out = avx512.counter_dropout(x, 3, round(0.5 * 2**32), 2.0)
    assert out.shape == x.shape
    assert torch.equal(out, _expected(x.contiguous(), 3, round(0.5 * 2**32), 2.0))


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bf16"])
def test_dropout_drops_p_and_scales_as_pytorch(kernel_on, dtype):
    p = 0.1
    x = torch.ones(1_000_000, dtype=dtype)
    assert counter_masks_serve(x)
    torch.manual_seed(0)
    ours = dropout(x, p)
    theirs = F.dropout(x, p, True)
    # The kept value is PyTorch's factor in this dtype, to the bit.
    assert torch.equal(ours[ours != 0].unique(), theirs[theirs != 0].unique())
    dropped = (ours == 0).double().mean().item()
    sigma = math.sqrt(p * (1 - p) / x.numel())
    assert abs(dropped - p) < 5 * sigma


@needs_kernel
def test_dropout_follows_pytorchs_generator(kernel_on):
    x = torch.randn(10_000)
    torch.manual_seed(5)
    first = dropout(x, 0.2)
    torch.manual_seed(5)
    again = dropout(x, 0.2)
    other = dropout(x, 0.2)  # the generator has moved on: another seed
    assert torch.equal(first, again)
    assert not torch.equal(first, other)
    # Which seed: one int64 draw from PyTorch's generator.
    torch.manual_seed(5)
    seed = int(torch.empty((), dtype=torch.int64).random_())
    assert torch.equal(first, _expected(x, seed, round(0.2 * 2**32), 1 / 0.8))


@needs_kernel
def test_backward_redraws_the_forwards_mask(kernel_on):
    x = torch.randn(5000, requires_grad=True)
    torch.manual_seed(1)
    y = dropout(x, 0.4)
    weights = torch.randn(5000)
    (y * weights).sum().backward()
    factor = (y / x).detach()  # the forward's factor per element: 0 or 1 / 0.6
    assert torch.allclose(x.grad, weights * factor, rtol=0, atol=1e-6)
    assert torch.equal(x.grad == 0, y == 0)


@needs_kernel
def test_nonfinite_inputs_give_what_pytorchs_product_gives(kernel_on):
    x = torch.tensor([float("nan"), float("inf"), 1.0] * 400)
    torch.manual_seed(2)
    y = dropout(x, 0.5)
    from_infinity = y[1::3]
    # inf times the factor: inf where kept, NaN where dropped (inf * 0), as input * noise.
    assert torch.isnan(y[0::3]).all()
    assert (torch.isinf(from_infinity) | torch.isnan(from_infinity)).all()
    assert torch.isnan(from_infinity).any() and torch.isinf(from_infinity).any()


def test_module_is_identity_in_eval_and_refuses_bad_p():
    module = Dropout(0.3).eval()
    x = torch.randn(10)
    assert module(x) is x
    with pytest.raises(ValueError, match="p"):
        Dropout(1.5)
    with pytest.raises(ValueError, match="dropout probability"):
        dropout(x, -0.1)


def test_outside_counter_masks_dropout_is_pytorchs():
    x = torch.randn(1000)
    for context in (counter_masks(False), contextlib.nullcontext()):
        with context:
            assert not counter_masks_serve(x)
            torch.manual_seed(3)
            ours = dropout(x, 0.25)
        torch.manual_seed(3)
        assert torch.equal(ours, F.dropout(x, 0.25, True))


def test_the_run_decides_its_masks_by_the_kernels_route(monkeypatch):
    monkeypatch.setenv("CLEARFORMER_AVX512_DROPOUT", "off")
    taken = routes.dropout_masks_route()
    assert taken.choice == "torch" and "CLEARFORMER_AVX512_DROPOUT=off" in taken.reason
    if machine().avx512_available and avx512.load(build=True).choice == "loaded":
        monkeypatch.delenv("CLEARFORMER_KERNELS", raising=False)
        monkeypatch.delenv("CLEARFORMER_AVX512", raising=False)
        monkeypatch.setenv("CLEARFORMER_AVX512_DROPOUT", "on")
        assert routes.dropout_masks_route().choice == "counter"


@needs_kernel
def test_attention_written_out_equals_the_reference_under_the_same_mask(kernel_on):
    torch.manual_seed(0)
    B, H, T, D = 3, 2, 7, 8
    q, k, v = (torch.randn(B, H, T, D, dtype=torch.float64).float() for _ in range(3))
    mask = torch.ones(B, 1, T, T, dtype=torch.bool)
    mask[0, :, :, 4:] = False  # padded keys
    mask[1, :, 2, :] = False  # a query with no key: zeros
    torch.manual_seed(9)
    out = _written_out(q, k, v, attn_mask=mask, dropout_p=0.25)
    torch.manual_seed(9)
    seed = int(torch.empty((), dtype=torch.int64).random_())
    _, weights = scaled_dot_product(q, k, v, mask)  # (B, H, T, T), zeros for the empty row
    keep = philox.mask_words(seed, weights.numel()).view(weights.shape) >= round(0.25 * 2**32)
    expected = (weights * keep * (1 / 0.75)) @ v
    assert torch.allclose(out, expected, atol=1e-6)
    assert torch.equal(out[1, :, 2], torch.zeros(H, D))


@needs_kernel
def test_attention_written_out_gradients_are_finite_for_a_query_without_keys(kernel_on):
    q, k, v = (torch.randn(2, 2, 5, 4, requires_grad=True) for _ in range(3))
    mask = torch.ones(2, 1, 5, 5, dtype=torch.bool)
    mask[0, :, 1, :] = False
    out = _written_out(q, k, v, attn_mask=mask, dropout_p=0.1)
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
    assert torch.equal(q.grad[0, :, 1], torch.zeros(2, 4))


@needs_kernel
def test_attention_written_out_takes_additive_masks_and_grouped_keys(kernel_on):
    torch.manual_seed(4)
    q = torch.randn(2, 4, 6, 8)
    k, v = torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8)
    additive = torch.zeros(1, 4, 6, 6).masked_fill(torch.ones(6, 6).triu(1).bool(), float("-inf"))
    torch.manual_seed(6)
    out = _written_out(q, k, v, attn_mask=additive, dropout_p=0.5)
    torch.manual_seed(6)
    seed = int(torch.empty((), dtype=torch.int64).random_())
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    _, weights = scaled_dot_product(q, k, v, causal)
    keep = philox.mask_words(seed, weights.numel()).view(weights.shape) >= round(0.5 * 2**32)
    expected = (weights * keep * 2.0) @ v.repeat_interleave(2, dim=1)
    assert torch.allclose(out, expected, atol=1e-6)


def test_length_groups_pad_no_sequence_past_twice_its_length():
    lengths = [3, 40, 17, 5, 40, 1, 20, 128]
    groups = varlen.length_groups(lengths)
    assert sorted(b for g in groups for b in g) == list(range(len(lengths)))
    for group in groups:
        longest = lengths[group[0]]
        assert all(2 * lengths[b] >= longest for b in group)
    assert varlen.length_groups([7, 7, 5]) == [[0, 1, 2]]


def test_padded_groups_equal_one_call_per_sequence():
    """Grouped padding (short and long sequences in one batch) against attention over each
    sequence alone: outputs and gradients."""
    torch.manual_seed(0)
    lengths = [3, 40, 17, 5, 40, 1]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    layout = layout_from_cu_seqlens(cu)
    base = [torch.randn(layout.num_tokens, 2, 8) for _ in range(3)]
    results = []
    for method in ("padded", "sequence"):
        q, k, v = (t.clone().requires_grad_() for t in base)
        out = varlen_attention(q, k, v, layout, method=method)
        (out * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum().backward()
        results.append((out, q.grad, k.grad, v.grad))
    for padded, alone in zip(*results, strict=True):
        torch.testing.assert_close(padded, alone, rtol=1e-5, atol=1e-6)


@needs_kernel
def test_activation_checkpointing_replays_the_masks(kernel_on):
    config = {"d_model": 16, "n_heads": 4, "n_layers": 3, "dim_mlp": 32, "dropout": 0.3}
    plain = Encoder(EncoderConfig(**config)).train()
    again = Encoder(EncoderConfig(**config, checkpointing=True)).train()
    again.load_state_dict(plain.state_dict())
    x = torch.randn(2, 5, 16)
    mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    results = []
    for model in (plain, again):
        torch.manual_seed(11)
        out = model(x, mask)
        out.pow(2).sum().backward()
        results.append([out.detach(), *(p.grad.clone() for p in model.parameters())])
    with torch.no_grad():
        assert not torch.equal(results[0][0], plain.eval()(x, mask))
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)
