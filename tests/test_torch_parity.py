"""Same numerics as torch.nn.TransformerEncoderLayer / TransformerEncoder, both directions."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from clearformer import Encoder, EncoderBlock, EncoderConfig, from_torch, to_torch

from .helpers import lengths_mask

# Rows with a single real token, a full row and ragged ones.
LENGTHS = [1, 7, 4, 2]


def torch_layer(norm_first, activation, heads, batch_first=True, d=32):
    layer = nn.TransformerEncoderLayer(
        d,
        heads,
        2 * d,
        dropout=0.1,
        activation=activation,
        batch_first=batch_first,
        norm_first=norm_first,
    )
    with torch.no_grad():  # non-trivial norms so that a swapped norm would show
        for norm in (layer.norm1, layer.norm2):
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
    return layer.eval()


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("heads", [1, 2, 8])
@pytest.mark.parametrize("backend", ["math", "sdpa"])
def test_block_matches_torch_layer(norm_first, activation, heads, backend):
    layer = torch_layer(norm_first, activation, heads)
    block = from_torch(layer, backend=backend)
    assert block.norm == ("pre" if norm_first else "post")
    x = torch.randn(len(LENGTHS), max(LENGTHS), 32)
    mask = lengths_mask(LENGTHS)
    with torch.no_grad():
        want = layer(x, src_key_padding_mask=~mask)
        got = block(x, mask)
    real = mask
    torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=1e-5)


def test_block_from_sequence_first_layer():
    layer = torch_layer(False, "relu", 4, batch_first=False)
    block = from_torch(layer)
    x = torch.randn(5, 3, 32)  # (T, B, D): torch.nn's sequence-first layout
    with torch.no_grad():
        want = layer(x).transpose(0, 1)
        got = block(x.transpose(0, 1))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh"])
def test_to_torch_round_trip(norm, activation):
    block = EncoderBlock(32, 4, 64, 0.1, norm=norm, activation=activation, norm_eps=1e-6).eval()
    layer = to_torch(block).eval()
    assert layer.self_attn.batch_first and layer.norm_first == (norm == "pre")
    x = torch.randn(3, 6, 32)
    mask = lengths_mask([6, 2, 1])
    with torch.no_grad():
        torch.testing.assert_close(
            layer(x, src_key_padding_mask=~mask)[mask], block(x, mask)[mask], atol=1e-5, rtol=1e-5
        )
    back = from_torch(layer)
    for (name, a), (_, b) in zip(
        block.state_dict().items(), back.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name


def test_to_torch_rejects_gated_activations():
    with pytest.raises(ValueError, match="swiglu.*gated"):
        to_torch(EncoderBlock(16, 2, 32, activation="swiglu"))


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("final_norm", [False, True])
@pytest.mark.parametrize("backend", ["math", "sdpa", "auto"])
def test_encoder_matches_torch_stack(norm_first, final_norm, backend):
    layer = torch_layer(norm_first, "gelu", 4)
    norm = nn.LayerNorm(32, eps=1e-6) if final_norm else None
    stack = nn.TransformerEncoder(layer, 3, norm=norm, enable_nested_tensor=False).eval()
    with torch.no_grad():  # layers are deep copies: make them differ
        for p in stack.parameters():
            p.add_(0.01 * torch.randn_like(p))
    encoder = from_torch(stack, backend=backend)
    assert encoder.config.use_final_norm == final_norm
    x = torch.randn(len(LENGTHS), max(LENGTHS), 32)
    mask = lengths_mask(LENGTHS)
    with torch.no_grad():
        want = stack(x, src_key_padding_mask=~mask)
        got = encoder(x, mask)
    torch.testing.assert_close(got[mask], want[mask], atol=1e-5, rtol=1e-5)
    assert (got[~mask] == 0).all()  # documented: padded positions are zero


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_encoder_to_torch_round_trip(norm):
    config = EncoderConfig(d_model=32, n_heads=4, n_layers=3, dim_mlp=64, norm=norm)
    encoder = Encoder(config).eval()
    stack = to_torch(encoder).eval()
    assert isinstance(stack, nn.TransformerEncoder) and len(stack.layers) == 3
    assert (stack.norm is not None) == config.use_final_norm
    x = torch.randn(len(LENGTHS), max(LENGTHS), 32)
    mask = lengths_mask(LENGTHS)
    with torch.no_grad():
        want = encoder(x, mask)
        got = stack(x, src_key_padding_mask=~mask)
        back = from_torch(stack)(x, mask)
    torch.testing.assert_close(got[mask], want[mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(back, want, atol=1e-6, rtol=1e-6)


def test_converters_name_what_they_accept():
    with pytest.raises(TypeError, match="EncoderBlock or Encoder, got Linear"):
        to_torch(nn.Linear(2, 2))
    with pytest.raises(
        TypeError, match="TransformerDecoderLayer or TransformerDecoder, got Linear"
    ):
        from_torch(nn.Linear(2, 2))
