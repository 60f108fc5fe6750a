"""Packed ids in, packed rows out: ``EncoderModel(ids (N,), cu_seqlens=...)`` equals the padded
call at every real position, for every kernel that serves packed rows, forward and backward."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from clearformer import Encoder, EncoderConfig, EncoderModel

BERT_LIKE = dict(
    d_model=32,
    n_heads=4,
    n_layers=2,
    dim_mlp=64,
    vocab_size=50,
    max_positions=24,
    type_vocab_size=2,
    embedding_norm=True,
    norm="post",
    position_offset=2,
    pad_token_id=1,
)
MODERN_LIKE = dict(
    d_model=32,
    n_heads=2,
    n_layers=4,
    dim_mlp=48,
    vocab_size=50,
    max_positions=64,
    positions="rotary",
    local_window=4,
    global_every=2,
    local_rope_theta=100.0,
    activation="geglu",
    bias=False,
    first_attn_norm=False,
)


def _batch(lengths: list[int], vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    T = max(lengths)
    ids = torch.randint(2, vocab, (len(lengths), T), generator=g)
    mask = torch.arange(T)[None] < torch.tensor(lengths)[:, None]  # (B, T) right padding
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return ids, mask, cu


@pytest.mark.parametrize("family", [BERT_LIKE, MODERN_LIKE], ids=["bert", "modernbert"])
@pytest.mark.parametrize("backend", ["auto", "varlen", "math"])
def test_packed_ids_equal_padded_call(family, backend):
    torch.manual_seed(0)
    model = EncoderModel(EncoderConfig(**family)).eval()
    lengths = [9, 3, 14, 1, 14]
    ids, mask, cu = _batch(lengths, 50)
    types = (torch.arange(ids.shape[1])[None] >= 2).long().expand_as(ids)
    kwargs = {"token_type_ids": types} if family.get("type_vocab_size", 0) else {}
    padded = model(ids, mask, backend="math", **kwargs)
    packed_kwargs = {k: v[mask] for k, v in kwargs.items()}
    packed = model(ids[mask], cu_seqlens=cu, backend=backend, **packed_kwargs)  # (N, D)
    assert packed.shape == (sum(lengths), 32)
    torch.testing.assert_close(packed, padded[mask], atol=2e-6, rtol=1e-5)


def test_packed_ids_gradients_equal_padded():
    torch.manual_seed(1)
    model = EncoderModel(EncoderConfig(**MODERN_LIKE))
    model.eval()  # no dropout: the two calls must see the same function
    ids, mask, cu = _batch([7, 12, 2], 50, seed=3)
    target = torch.randn(int(mask.sum()), 32)

    def grads(out):
        model.zero_grad()
        ((out - target) ** 2).sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    padded = grads(model(ids, mask, backend="sdpa")[mask])
    packed = grads(model(ids[mask], cu_seqlens=cu))
    assert padded.keys() == packed.keys()
    for name in padded:
        torch.testing.assert_close(packed[name], padded[name], atol=1e-5, rtol=1e-4, msg=name)


def test_packed_hidden_states_stay_packed():
    torch.manual_seed(2)
    model = EncoderModel(EncoderConfig(**BERT_LIKE)).eval()
    ids, mask, cu = _batch([5, 8], 50)
    padded = model(ids, mask, output_hidden_states=True)
    packed = model(ids[mask], cu_seqlens=cu, output_hidden_states=True)
    assert len(packed.hidden_states) == len(padded.hidden_states) == 3
    for ours, theirs in zip(packed.hidden_states, padded.hidden_states, strict=True):
        torch.testing.assert_close(ours, theirs[mask], atol=2e-6, rtol=1e-5)


@settings(max_examples=25, deadline=None)
@given(lengths=st.lists(st.integers(0, 12), min_size=1, max_size=6))
def test_packed_vectors_equal_each_sequence_alone(lengths):
    """Encoder on packed vectors: each sequence's rows equal that sequence encoded alone,
    whatever the others (empty sequences included)."""
    torch.manual_seed(3)
    encoder = Encoder(EncoderConfig(d_model=16, n_heads=2, n_layers=2, dim_mlp=32)).eval()
    N = sum(lengths)
    x = torch.randn(N, 16)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    out = encoder(x, cu_seqlens=cu)
    assert out.shape == (N, 16)
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        if b > a:
            alone = encoder(x[a:b][None], backend="math")[0]
            torch.testing.assert_close(out[a:b], alone, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        (dict(cu_seqlens=[0, 3]), TypeError, "cu_seqlens must be a (B + 1,) integer tensor"),
        (dict(cu_seqlens=torch.tensor([0.0, 3.0])), TypeError, "integers"),
        (dict(cu_seqlens=torch.tensor([0, 6], dtype=torch.complex128)), TypeError, "integers"),
        (dict(cu_seqlens=torch.tensor([False, True])), TypeError, "integers"),
        (dict(cu_seqlens=torch.tensor([0])), ValueError, "shape (B + 1,)"),
        (dict(cu_seqlens=torch.tensor([1, 6])), ValueError, "start at 0"),
        (dict(cu_seqlens=torch.tensor([0, 4, 2, 6])), ValueError, "never decrease"),
        (dict(cu_seqlens=torch.tensor([0, 5])), ValueError, "end at N=6"),
        (dict(cu_seqlens=torch.tensor([0, 6]), backend="sdpa"), ValueError, "padded layout"),
        (
            dict(cu_seqlens=torch.tensor([0, 6]), output_attentions=True),
            ValueError,
            "output_attentions",
        ),
        (
            dict(cu_seqlens=torch.tensor([0, 6]), attention_mask=torch.ones(1, 6)),
            ValueError,
            "attention_mask must be None",
        ),
        (
            dict(cu_seqlens=torch.tensor([0, 6]), token_type_ids=torch.zeros(5, dtype=int)),
            ValueError,
            "token_type_ids must have shape (N,)",
        ),
    ],
)
def test_bad_packed_input_is_named(kwargs, error, words):
    model = EncoderModel(EncoderConfig(**BERT_LIKE)).eval()
    ids = torch.randint(2, 50, (6,))
    with pytest.raises(error) as info:
        model(ids, **kwargs)
    assert words in str(info.value)


def test_packed_sequence_over_the_limit_is_refused():
    model = EncoderModel(EncoderConfig(**BERT_LIKE)).eval()  # max_length 22
    ids = torch.randint(2, 50, (30,))
    with pytest.raises(ValueError, match="sequence of 23 tokens, above the model's limit"):
        model(ids, cu_seqlens=torch.tensor([0, 7, 30]))
    with pytest.raises(ValueError, match=r"shape \(N,\) with cu_seqlens"):
        model(ids[None], cu_seqlens=torch.tensor([0, 30]))
