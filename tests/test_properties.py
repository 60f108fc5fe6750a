"""Invariances that must hold for any input (Hypothesis)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from clearformer import Encoder, EncoderBlock, EncoderConfig

from .helpers import lengths_mask

D, H = 16, 4
norms = st.sampled_from(["pre", "post"])
backends = st.sampled_from(["math", "sdpa"])
lengths_st = st.lists(st.integers(1, 6), min_size=1, max_size=4)
# With empty sequences: rows whose queries have no key at all.
lengths_or_empty_st = st.lists(st.integers(0, 6), min_size=1, max_size=4)
seeds = st.integers(0, 2**16)


def make_block(norm, backend, activation="gelu"):
    return EncoderBlock(D, H, 2 * D, norm=norm, backend=backend, activation=activation).eval()


@given(norm=norms, backend=backends, lengths=lengths_st, seed=seeds)
def test_padding_content_does_not_matter(norm, backend, lengths, seed):
    torch.manual_seed(seed)
    block = make_block(norm, backend)
    T = max(lengths) + 2
    mask = lengths_mask(lengths, T)
    x = torch.randn(len(lengths), T, D)
    noisy = torch.where(mask[..., None], x, 100 * torch.randn_like(x))
    with torch.no_grad():
        a, b = block(x, mask), block(noisy, mask)
    torch.testing.assert_close(a[mask], b[mask], atol=1e-5, rtol=1e-5)


@given(norm=norms, lengths=lengths_st, seed=seeds, backend=st.sampled_from(["auto", "sdpa"]))
def test_sequence_alone_equals_sequence_in_padded_batch(norm, lengths, seed, backend):
    torch.manual_seed(seed)
    cfg = EncoderConfig(d_model=D, n_heads=H, n_layers=2, dim_mlp=2 * D, norm=norm, backend=backend)
    encoder = Encoder(cfg).eval()
    T = max(lengths)
    x = torch.randn(len(lengths), T, D)
    with torch.no_grad():
        batch = encoder(x, lengths_mask(lengths, T))
        for b, n in enumerate(lengths):
            alone = encoder(x[b : b + 1, :n])
            torch.testing.assert_close(batch[b, :n], alone[0], atol=1e-5, rtol=1e-5)


@given(norm=norms, backend=backends, T=st.integers(2, 7), seed=seeds)
def test_permutation_equivariance_without_positions(norm, backend, T, seed):
    torch.manual_seed(seed)
    block = make_block(norm, backend)
    x = torch.randn(2, T, D)
    perm = torch.randperm(T)
    with torch.no_grad():
        torch.testing.assert_close(block(x)[:, perm], block(x[:, perm]), atol=1e-5, rtol=1e-5)


@given(
    norm=norms,
    lengths=lengths_or_empty_st,
    seed=seeds,
    activation=st.sampled_from(["relu", "gelu", "gelu_tanh", "swiglu", "geglu"]),
)
def test_math_and_sdpa_agree_with_masks(norm, lengths, seed, activation):
    torch.manual_seed(seed)
    math_block = make_block(norm, "math", activation)
    sdpa_block = make_block(norm, "sdpa", activation)
    sdpa_block.load_state_dict(math_block.state_dict())
    T = max(lengths) + 1  # at least one padded key in every row
    mask = lengths_mask(lengths, T)
    x = torch.randn(len(lengths), T, D)
    with torch.no_grad():
        torch.testing.assert_close(math_block(x, mask), sdpa_block(x, mask), atol=1e-5, rtol=1e-5)


@given(lengths=lengths_st, seed=seeds)
def test_weights_are_distributions_and_zero_on_masked_keys(lengths, seed):
    torch.manual_seed(seed)
    block = make_block("pre", "math")
    T = max(lengths) + 1
    mask = lengths_mask(lengths, T)
    x = torch.randn(len(lengths), T, D)
    with torch.no_grad():
        _, w = block.attn(x, mask=mask, need_weights=True)
    torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]))
    assert (w.masked_select(~mask[:, None, None, :]) == 0).all()


@given(backend=backends, T=st.integers(1, 6), seed=seeds)
def test_pre_norm_with_zero_output_projections_is_identity(backend, T, seed):
    torch.manual_seed(seed)
    block = make_block("pre", backend)
    with torch.no_grad():
        for linear in (block.attn.out_proj, block.mlp.fc_out):
            linear.weight.zero_()
            linear.bias.zero_()
    x = torch.randn(2, T, D)
    with torch.no_grad():
        assert torch.equal(block(x), x)


@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_block_gradcheck_float64(norm, backend):
    block = EncoderBlock(8, 2, 12, norm=norm, backend=backend, activation="gelu").double()
    x = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    mask = lengths_mask([3, 1])
    assert torch.autograd.gradcheck(lambda t: block(t, mask), (x,), eps=1e-6, atol=1e-5)
