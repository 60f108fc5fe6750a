"""The core on empty and non-finite input: empty in, empty out; padding never reaches a real
token, whatever it holds, on every backend and layout."""

from __future__ import annotations

import pytest
import torch

from clearformer import Encoder, EncoderBlock, EncoderConfig, EncoderModel, MultiHeadAttention

from ..helpers import lengths_mask

D, H = 16, 4
BACKENDS = ("auto", "math", "sdpa", "varlen")


def encoder(backend: str, **overrides) -> Encoder:
    config = EncoderConfig(d_model=D, n_heads=H, n_layers=2, dim_mlp=32, backend=backend)
    return Encoder(config).eval()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", [(0, 5), (3, 0), (0, 0)])
@pytest.mark.parametrize("masked", [False, True])
def test_an_empty_batch_gives_an_empty_result(backend, shape, masked):
    x = torch.randn(*shape, D, requires_grad=True)
    mask = torch.ones(shape, dtype=torch.bool) if masked else None
    out = encoder(backend)(x, mask)
    assert out.shape == x.shape
    out.sum().backward()  # and trains: an empty batch has a zero gradient
    assert x.grad.shape == x.shape


@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_empty_input_through_a_lone_attention_module(backend):
    attn = MultiHeadAttention(D, D, D, D, H, backend=backend)
    out, _ = attn(torch.randn(0, 4, D))
    assert out.shape == (0, 4, D)
    out, _ = attn(torch.randn(2, 0, D), mask=torch.ones(2, 0, dtype=torch.bool))
    assert out.shape == (2, 0, D)


def test_the_model_on_the_tokenization_of_no_text():
    model = EncoderModel(
        EncoderConfig(d_model=D, n_heads=H, n_layers=1, dim_mlp=32, vocab_size=30)
    ).eval()
    with torch.no_grad():
        assert model(torch.zeros(0, 7, dtype=torch.long)).shape == (0, 7, D)
        ids = torch.zeros(0, 0, dtype=torch.long)
        assert model(ids, torch.zeros(0, 0, dtype=torch.long)).shape == (0, 0, D)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("poison", [float("nan"), float("inf"), -float("inf"), 1e30])
@pytest.mark.parametrize("padding", ["little", "much"])  # under and over the packing threshold
def test_whatever_padding_holds_never_reaches_real_tokens(backend, poison, padding):
    lengths = [40, 39] if padding == "little" else [40, 7]
    mask = lengths_mask(lengths)
    model = encoder(backend)
    clean = torch.randn(2, 40, D)
    poisoned = clean.clone()
    poisoned[~mask] = poison
    with torch.no_grad():
        want, got = model(clean, mask), model(poisoned, mask)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)  # pads included: zeros


@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("norm", ["pre", "post"])
def test_a_lone_block_keeps_a_poisoned_pad_to_itself(backend, norm):
    block = EncoderBlock(D, H, 32, norm=norm, backend=backend).eval()
    mask = lengths_mask([5, 3])
    clean = torch.randn(2, 5, D)
    poisoned = clean.clone()
    poisoned[~mask] = float("nan")
    with torch.no_grad():
        want, got = block(clean, mask), block(poisoned, mask)
    torch.testing.assert_close(got[mask], want[mask], atol=1e-6, rtol=1e-6)


def test_a_key_some_queries_may_see_still_counts():
    """Only keys that no query may see are cleared: a key seen by one query still counts."""
    attn = MultiHeadAttention(D, D, D, D, H, backend="math").eval()
    x = torch.randn(1, 4, D)
    mask = torch.zeros(1, 4, 4, dtype=torch.bool)
    mask[0, :, :2] = True
    mask[0, 0, 3] = True  # key 3: query 0 only; key 2: nobody
    plan = attn.plan_for(x, mask=mask)
    assert plan.key_in_use.flatten().tolist() == [True, True, False, True]
    assert attn.plan_for(x, is_causal=True).key_in_use is None  # the last query sees them all
    moved = x.clone()
    moved[0, 3] += 1.0
    with torch.no_grad():
        before, _ = attn(x, mask=mask)
        after, _ = attn(moved, mask=mask)
    assert not torch.allclose(before[0, 0], after[0, 0])  # query 0 still reads key 3
    torch.testing.assert_close(before[0, 1:3], after[0, 1:3])  # the others never do
