"""Blocks follow their documented formulas; the stack is built and trained as configured."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from clearformer import Encoder, EncoderBlock, EncoderConfig, FeedForward

from .helpers import lengths_mask


def attn_only(block, h, mask):
    return block.attn(h, h, h, mask)[0]


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_block_is_its_docstring_formula(norm):
    block = EncoderBlock(16, 4, 32, norm=norm, activation="gelu").eval()
    x = torch.randn(2, 5, 16)
    mask = lengths_mask([5, 2])
    with torch.no_grad():
        if norm == "pre":
            z = x + attn_only(block, block.attn_norm(x), mask)
            want = z + block.mlp(block.mlp_norm(z))
        else:
            z = block.attn_norm(x + attn_only(block, x, mask))
            want = block.mlp_norm(z + block.mlp(z))
        torch.testing.assert_close(block(x, mask), want)


@pytest.mark.parametrize(
    "activation,fn",
    [
        ("relu", F.relu),
        ("gelu", F.gelu),
        ("gelu_tanh", lambda t: F.gelu(t, approximate="tanh")),
    ],
)
def test_plain_activations(activation, fn):
    ff = FeedForward(8, 16, activation)
    x = torch.randn(3, 8)
    torch.testing.assert_close(ff(x), ff.fc_out(fn(ff.fc_in(x))))


@pytest.mark.parametrize("activation,gate_fn", [("swiglu", F.silu), ("geglu", F.gelu)])
def test_gated_activations(activation, gate_fn):
    ff = FeedForward(8, 16, activation)
    assert ff.fc_in.out_features == 32 and ff.fc_out.in_features == 16
    x = torch.randn(3, 8)
    gate = x @ ff.fc_in.weight[:16].T + ff.fc_in.bias[:16]
    value = x @ ff.fc_in.weight[16:].T + ff.fc_in.bias[16:]
    torch.testing.assert_close(ff(x), ff.fc_out(gate_fn(gate) * value))


def test_bias_false_removes_every_bias():
    block = EncoderBlock(16, 4, 32, bias=False)
    names = [n for n, _ in block.named_parameters()]
    assert not [n for n in names if n.endswith("bias")], names


def test_dropout_active_only_in_training():
    block = EncoderBlock(16, 4, 32, dropout=0.3)
    x = torch.randn(2, 5, 16)
    block.eval()
    torch.testing.assert_close(block(x), block(x))
    block.train()
    assert not torch.allclose(block(x), block(x))


def test_attn_dropout_defaults_to_dropout_and_can_differ():
    assert EncoderBlock(16, 4, 32, 0.2).attn.attn_dropout == 0.2
    assert EncoderBlock(16, 4, 32, 0.2, attn_dropout=0.0).attn.attn_dropout == 0.0


def small_config(**kw):
    return EncoderConfig(**{"d_model": 16, "n_heads": 4, "n_layers": 3, "dim_mlp": 32, **kw})


def test_layers_are_initialised_independently():
    encoder = Encoder(small_config())
    w = [layer.attn.in_proj.weight for layer in encoder.layers]
    assert not torch.equal(w[0], w[1]) and not torch.equal(w[1], w[2])


@pytest.mark.parametrize("norm,final", [("pre", True), ("post", False)])
def test_final_norm_by_default_only_for_pre_norm(norm, final):
    encoder = Encoder(small_config(norm=norm))
    assert isinstance(encoder.final_norm, torch.nn.LayerNorm) == final
    assert isinstance(
        Encoder(small_config(norm=norm, final_norm=True)).final_norm, torch.nn.LayerNorm
    )


def test_activation_checkpointing_gives_same_gradients():
    plain = Encoder(small_config(dropout=0.0)).train()
    ckpt = Encoder(small_config(dropout=0.0, checkpointing=True)).train()
    ckpt.load_state_dict(plain.state_dict())
    x = torch.randn(2, 5, 16)
    mask = lengths_mask([5, 3])
    grads = []
    for model in (plain, ckpt):
        model.zero_grad()
        model(x, mask).pow(2).sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b)


def test_config_round_trips_through_a_dict():
    cfg = small_config(activation="swiglu", norm_eps=1e-12)
    assert EncoderConfig.from_dict(cfg.to_dict()) == cfg


def test_encoder_output_is_zero_at_padding_on_every_backend():
    x = torch.randn(3, 6, 16)
    mask = lengths_mask([6, 2, 0])  # the last sequence is empty
    outs = []
    reference = Encoder(small_config(backend="math")).eval()
    for backend in ("math", "sdpa", "varlen", "auto"):
        encoder = Encoder(small_config(backend=backend)).eval()
        encoder.load_state_dict(reference.state_dict())
        with torch.no_grad():
            out = encoder(x, mask)
        assert torch.isfinite(out).all()
        assert (out[~mask] == 0).all()
        outs.append(out)
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0], atol=1e-5, rtol=1e-5)
