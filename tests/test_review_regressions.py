"""Regressions: conversions, configurations and checks that once failed."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from clearformer import Encoder, EncoderBlock, EncoderConfig, MultiHeadAttention, from_torch

from .helpers import lengths_mask


@pytest.mark.parametrize(
    "layer_bias,norm_kwargs",
    [
        (False, {}),  # bias-free layers, a final norm with a bias (torch.nn's default)
        (True, {"bias": False}),  # the reverse
        (True, {"elementwise_affine": False}),  # a final norm without parameters
    ],
)
def test_encoder_from_torch_keeps_the_final_norm_as_built(layer_bias, norm_kwargs):
    layer = nn.TransformerEncoderLayer(
        16, 4, 32, batch_first=True, norm_first=True, bias=layer_bias
    )
    norm = nn.LayerNorm(16, eps=1e-6, **norm_kwargs)
    stack = nn.TransformerEncoder(layer, 2, norm=norm, enable_nested_tensor=False).eval()
    with torch.no_grad():
        for p in stack.parameters():
            p.add_(0.1 * torch.randn_like(p))
    encoder = from_torch(stack).eval()
    x = torch.randn(2, 5, 16)
    mask = lengths_mask([5, 2])
    with torch.no_grad():
        want = stack(x, src_key_padding_mask=~mask)
        got = encoder(x, mask)
    torch.testing.assert_close(got[mask], want[mask], atol=1e-5, rtol=1e-5)


def test_encoder_from_torch_rejects_a_final_norm_of_another_width():
    layer = nn.TransformerEncoderLayer(16, 4, 32, batch_first=True)
    stack = nn.TransformerEncoder(layer, 1, norm=nn.LayerNorm(8), enable_nested_tensor=False)
    with pytest.raises(ValueError, match=r"final norm.*\(16,\).*\(8,\)"):
        from_torch(stack)


def test_config_says_layout_and_kernel_once():
    """One knob: 'varlen' always packs, 'sdpa' and 'math' never do, so no combination of two
    knobs can contradict itself. An old config with 'packing' gets told what replaced it."""
    ragged = torch.tensor([[True] * 8, [True] + [False] * 7])
    full = torch.ones(2, 8, dtype=torch.bool)
    varlen = Encoder(EncoderConfig(d_model=16, n_heads=4, n_layers=1, backend="varlen"))
    assert varlen.plan_for(ragged).packed and varlen.plan_for(full).packed
    for backend in ("sdpa", "math"):
        padded = Encoder(EncoderConfig(d_model=16, n_heads=4, n_layers=1, backend=backend))
        assert not padded.plan_for(ragged).packed
        assert padded.plan_for(ragged).kernel.choice == backend
    with pytest.raises(TypeError, match="packing"):
        EncoderConfig(d_model=16, n_heads=4, packing="never")
    with pytest.raises(ValueError, match="'packing' is now backend"):
        EncoderConfig.from_dict({"d_model": 16, "n_heads": 4, "packing": "always"})


@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize(
    "mask,exc",
    [
        (torch.ones(2, 4, dtype=torch.bool), ValueError),  # wrong shape
        (torch.ones(2, 5, dtype=torch.int64), TypeError),  # wrong dtype
    ],
)
def test_block_rejects_a_bad_mask_before_any_work(norm, mask, exc):
    block = EncoderBlock(16, 4, 32, norm=norm).eval()
    calls = []
    for module in block.modules():
        module.register_forward_hook(lambda *_: calls.append(1))
    with pytest.raises(exc, match="mask"):
        block(torch.randn(2, 5, 16), mask)
    assert not calls


@pytest.mark.parametrize(
    "kwargs,exc,fragments",
    [
        ({"dropout": "0.1"}, TypeError, ("dropout", "float", "'0.1'")),
        ({"attn_dropout": "0"}, TypeError, ("attn_dropout", "float", "'0'")),
        ({"norm_eps": "1e-5"}, TypeError, ("norm_eps", "float", "'1e-5'")),
        ({"position_offset": -1}, ValueError, ("position_offset", "[0, 512)", "-1")),
        ({"position_offset": 600}, ValueError, ("position_offset", "[0, 512)", "600")),
        ({"type_vocab_size": 1.5}, ValueError, ("type_vocab_size", "int", "1.5")),
    ],
)
def test_config_names_the_field_for_every_bad_value(kwargs, exc, fragments):
    with pytest.raises(exc) as info:
        EncoderConfig(**kwargs)
    for fragment in fragments:
        assert fragment in str(info.value)


@pytest.mark.parametrize(
    "kwargs,exc,fragments",
    [
        ({"norm_eps": 0.0}, ValueError, ("norm_eps", "> 0", "0.0")),
        ({"norm_eps": -1.0}, ValueError, ("norm_eps", "> 0", "-1.0")),
        ({"dropout": None}, TypeError, ("dropout", "float", "None")),
    ],
)
def test_block_names_the_argument_for_every_bad_value(kwargs, exc, fragments):
    with pytest.raises(exc) as info:
        EncoderBlock(16, 4, 32, **kwargs)
    for fragment in fragments:
        assert fragment in str(info.value)


def _model(type_vocab_size: int):
    from clearformer.model import EncoderModel

    config = EncoderConfig(
        d_model=16,
        n_heads=4,
        n_layers=1,
        dim_mlp=32,
        vocab_size=30,
        type_vocab_size=type_vocab_size,
    )
    return EncoderModel(config).eval()


@pytest.mark.parametrize(
    "type_vocab_size,value,fragments",
    [
        (2, 5, ("token_type_ids", "[0, 2)", "5")),  # beyond the table: was an IndexError
        (0, 1, ("token_type_ids", "no token type", "1")),  # silently ignored before
    ],
)
def test_model_checks_token_type_ids(type_vocab_size, value, fragments):
    ids = torch.randint(1, 30, (2, 4))
    with pytest.raises(ValueError) as info:
        _model(type_vocab_size)(ids, token_type_ids=torch.full_like(ids, value))
    for fragment in fragments:
        assert fragment in str(info.value)
    # zeros are what a tokenizer gives for single texts: accepted with or without a table
    _model(type_vocab_size)(ids, token_type_ids=torch.zeros_like(ids))


def test_model_rejects_a_mask_that_is_not_a_tensor():
    ids = torch.randint(1, 30, (2, 4))
    with pytest.raises(TypeError, match="attention_mask.*Tensor.*list"):
        _model(0)(ids, attention_mask=[[1, 1, 1, 1], [1, 1, 0, 0]])


def test_explain_takes_a_0_1_mask_for_vectors_as_documented():
    """``explain``'s docstring: mask (B, T), True (or 1) = real token, for every model kind."""
    from clearformer.explainer import explain

    encoder = Encoder(EncoderConfig(d_model=16, n_heads=4, n_layers=1, dim_mlp=32)).eval()
    x = torch.randn(2, 4, 16)
    ints = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    got = explain(encoder, x, ints)
    want = explain(encoder, x, ints.bool())
    torch.testing.assert_close(got.output, want.output)
    assert got.token_mask.tolist() == ints.bool().tolist()


@pytest.mark.parametrize("backend", ["math", "sdpa", "varlen", "auto"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_stack_with_an_empty_sequence_has_zeros_and_finite_gradients(backend, dtype):
    """The contract for rows with no key, held for the whole stack (padded and packed), in
    every backend and dtype, backward included (the attention tests cover one layer only)."""
    torch.manual_seed(0)
    config = EncoderConfig(d_model=16, n_heads=4, n_layers=2, dim_mlp=32, backend=backend)
    encoder = Encoder(config).to(dtype)
    x = torch.randn(3, 5, 16, dtype=dtype, requires_grad=True)
    mask = lengths_mask([2, 0, 5], 5)
    out = encoder(x, mask)
    assert torch.isfinite(out).all() and (out[1] == 0).all()
    out.float().pow(2).sum().backward()
    assert torch.isfinite(x.grad).all() and (x.grad[1] == 0).all()
    for name, p in encoder.named_parameters():
        assert p.grad is None or torch.isfinite(p.grad).all(), name


@pytest.mark.parametrize("T", [14, 15, 16])
def test_text_listing_never_cuts_the_attention_grid(T):
    """Wide grids switch to "strongest keys per query"; a grid that is printed is whole."""
    from clearformer.explainer import Filters, explain, render_text

    encoder = Encoder(EncoderConfig(d_model=16, n_heads=4, n_layers=1, dim_mlp=32)).eval()
    text = render_text(explain(encoder, torch.randn(1, T, 16)), Filters(step="attn.weights"))
    assert not [line for line in text.splitlines() if line.endswith("...")]
    assert all(len(line) <= 100 for line in text.splitlines())
    assert "t0 ->" in text or f"t{T - 1}" in text.splitlines()[-1]


def test_text_listing_wraps_long_step_titles_instead_of_cutting_them():
    from clearformer.explainer import explain, render_text

    encoder = Encoder(EncoderConfig(d_model=16, n_heads=4, n_layers=1, dim_mlp=32)).eval()
    text = render_text(explain(encoder, torch.randn(1, 3, 16)))
    cut = [line for line in text.splitlines() if line.endswith("...") and line != "..."]
    assert not cut
    assert "(shown: Q)" in text


@pytest.mark.parametrize(
    "load,key,state",
    [
        ("block_from_seed000", "W_Q.weight", {"W_K.weight": torch.zeros(8, 8)}),
        ("block_from_seed000", "ffn.0.weight", {"W_Q.weight": torch.zeros(8, 8)}),
        ("block_from_seed001", "attn.Q.weight", {}),
    ],
)
def test_seed_loaders_name_a_missing_key(load, key, state):
    from clearformer.interop import seeds

    with pytest.raises(ValueError, match=f"missing keys.*{key}"):
        getattr(seeds, load)(state, 2)


def test_math_attention_stays_finite_in_float16_with_large_inputs():
    attn = MultiHeadAttention(64, 64, 64, 64, 2, backend="math").half()
    x = (torch.randn(1, 8, 64) * 300).half()
    out, w = attn(x, need_weights=True)
    assert torch.isfinite(out).all() and torch.isfinite(w).all()
