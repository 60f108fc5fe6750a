"""Bad input fails early with a message naming the argument, the expectation and the value."""

from __future__ import annotations

import re

import pytest
import torch

from clearformer import Encoder, EncoderBlock, EncoderConfig, MultiHeadAttention

from .helpers import lengths_mask


def raises(exc, *fragments):
    """``pytest.raises`` that wants every fragment somewhere in the message."""
    pattern = "".join(f"(?=.*{re.escape(f)})" for f in fragments)
    return pytest.raises(exc, match=re.compile(pattern, re.S))


# -- construction --------------------------------------------------------------------------------
def test_d_model_not_divisible_by_heads():
    with raises(ValueError, "d_model", "divisible", "n_heads", "30", "4"):
        EncoderBlock(30, 4, 64)
    with raises(ValueError, "d_model", "divisible", "30", "4"):
        EncoderConfig(d_model=30, n_heads=4)


@pytest.mark.parametrize("arg", ["qk_dim", "v_dim"])
def test_qk_or_v_dim_not_divisible(arg):
    dims = dict(qk_dim=16, v_dim=16)
    dims[arg] = 18
    with raises(ValueError, arg, "divisible", "18", "4"):
        MultiHeadAttention(16, dims["qk_dim"], dims["v_dim"], 16, 4)


@pytest.mark.parametrize(
    "kwargs,fragments",
    [
        (dict(backend="flash"), ("backend", "flash", "sdpa")),
        (dict(norm="middle"), ("norm", "middle", "pre")),
        (dict(activation="tanh"), ("activation", "tanh", "gelu")),
    ],
)
def test_unknown_names(kwargs, fragments):
    with raises(ValueError, *fragments):
        EncoderBlock(16, 4, 32, **kwargs)
    with raises(ValueError, *fragments):
        EncoderConfig(d_model=16, n_heads=4, **kwargs)


def test_config_rejects_bad_values():
    with raises(ValueError, "n_layers", "positive", "0"):
        EncoderConfig(n_layers=0)
    with raises(ValueError, "dropout", "[0, 1)", "1.5"):
        EncoderConfig(dropout=1.5)
    with raises(ValueError, "unknown", "depth"):
        EncoderConfig.from_dict({"depth": 3})
    with raises(TypeError, "EncoderConfig", "dict"):
        Encoder({"d_model": 16})


# -- inputs --------------------------------------------------------------------------------------
@pytest.fixture
def block():
    return EncoderBlock(16, 4, 32).eval()


def test_input_not_3d(block):
    with raises(ValueError, "x", "3-D", "(5, 16)"):
        block(torch.randn(5, 16))


def test_input_wrong_width(block):
    with raises(ValueError, "x", "d_model=16", "12"):
        block(torch.randn(2, 5, 12))
    enc = Encoder(EncoderConfig(d_model=16, n_heads=4, n_layers=1, dim_mlp=32))
    with raises(ValueError, "x", "d_model=16", "(2, 5, 12)"):
        enc(torch.randn(2, 5, 12))


def test_query_key_batch_mismatch():
    attn = MultiHeadAttention(8, 8, 8, 8, 2)
    with raises(ValueError, "batch", "2", "3"):
        attn(torch.randn(2, 4, 8), torch.randn(3, 4, 8), torch.randn(3, 4, 8))


def test_key_width_mismatch():
    attn = MultiHeadAttention(8, 8, 8, 8, 2, kv_dim=6)
    with raises(ValueError, "key", "kv_dim=6", "8"):
        attn(torch.randn(2, 4, 8), torch.randn(2, 4, 8))


def test_query_key_device_mismatch():
    attn = MultiHeadAttention(8, 8, 8, 8, 2)
    with raises(ValueError, "key", "device", "cpu", "meta"):
        attn(torch.randn(2, 4, 8), torch.randn(2, 4, 8, device="meta"))


def test_mask_wrong_shape(block):
    with raises(ValueError, "mask", "(B, Tk) = (2, 5)", "(2, 4)"):
        block(torch.randn(2, 5, 16), torch.ones(2, 4, dtype=torch.bool))
    enc = Encoder(EncoderConfig(d_model=16, n_heads=4, n_layers=1, dim_mlp=32))
    with raises(ValueError, "mask", "(2, 5)", "(5, 2)"):
        enc(torch.randn(2, 5, 16), torch.ones(5, 2, dtype=torch.bool))


@pytest.mark.parametrize("dtype,hint", [(torch.int64, ".bool()"), (torch.float32, "== 0")])
def test_mask_wrong_dtype_has_hint(block, dtype, hint):
    mask = lengths_mask([5, 2]).to(dtype)
    with raises(TypeError, "mask", "torch.bool", str(dtype), hint):
        block(torch.randn(2, 5, 16), mask)


def test_mask_wrong_device(block):
    with raises(ValueError, "mask", "device", "meta"):
        block(torch.randn(2, 5, 16), torch.ones(2, 5, dtype=torch.bool, device="meta"))


def test_weights_from_a_backend_that_cannot_return_them():
    attn = MultiHeadAttention(8, 8, 8, 8, 2, backend="sdpa")
    with raises(ValueError, "need_weights", "sdpa", "math"):
        attn(torch.randn(1, 3, 8), need_weights=True)


def test_varlen_on_padded_input_is_an_error_not_a_fallback():
    attn = MultiHeadAttention(8, 8, 8, 8, 2, backend="varlen")
    with raises(ValueError, "varlen", "packed"):
        attn(torch.randn(1, 3, 8))


def test_errors_come_before_any_work(monkeypatch):
    """Validation runs before the projections: a bad mask never reaches a matmul."""
    attn = MultiHeadAttention(8, 8, 8, 8, 2)
    called = []
    monkeypatch.setattr(attn, "project", lambda *a: called.append(1))
    with pytest.raises(TypeError):
        attn(torch.randn(1, 3, 8), mask=torch.ones(1, 3))
    assert not called
