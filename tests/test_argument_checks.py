"""One set of argument checks: the same bad value gets the same error type and wording from
every class that takes it (the config, a block, attention, the feed-forward network)."""

from __future__ import annotations

import pytest

from clearformer import EncoderBlock, EncoderConfig, FeedForward, MultiHeadAttention


def builders(argument: str):
    """Ways to give ``argument`` a value, one per class that takes it."""
    good = dict(d_model=16, n_heads=4, dim_mlp=32)
    return {
        "d_model": [
            lambda v: EncoderConfig(**{**good, "d_model": v}),
            lambda v: EncoderBlock(v, 4, 32),
            lambda v: FeedForward(v, 32),
        ],
        "n_heads": [
            lambda v: EncoderConfig(**{**good, "n_heads": v}),
            lambda v: EncoderBlock(16, v, 32),
            lambda v: MultiHeadAttention(16, 16, 16, 16, v),
        ],
        "dim_mlp": [
            lambda v: EncoderConfig(**{**good, "dim_mlp": v}),
            lambda v: EncoderBlock(16, 4, v),
            lambda v: FeedForward(16, v),
        ],
        "dropout": [
            lambda v: EncoderConfig(**{**good, "dropout": v}),
            lambda v: EncoderBlock(16, 4, 32, v),
        ],
        "attn_dropout": [
            lambda v: EncoderConfig(**{**good, "attn_dropout": v}),
            lambda v: EncoderBlock(16, 4, 32, attn_dropout=v),
            lambda v: MultiHeadAttention(16, 16, 16, 16, 4, v),
        ],
        "norm_eps": [
            lambda v: EncoderConfig(**{**good, "norm_eps": v}),
            lambda v: EncoderBlock(16, 4, 32, norm_eps=v),
        ],
        "activation": [
            lambda v: EncoderConfig(**{**good, "activation": v}),
            lambda v: EncoderBlock(16, 4, 32, activation=v),
            lambda v: FeedForward(16, 32, v),
        ],
        "norm": [
            lambda v: EncoderConfig(**{**good, "norm": v}),
            lambda v: EncoderBlock(16, 4, 32, norm=v),
        ],
        "backend": [
            lambda v: EncoderConfig(**{**good, "backend": v}),
            lambda v: EncoderBlock(16, 4, 32, backend=v),
            lambda v: MultiHeadAttention(16, 16, 16, 16, 4, backend=v),
        ],
    }[argument]


CASES = [
    ("d_model", True, ValueError, "must be a positive int, got True"),
    ("d_model", 0, ValueError, "must be a positive int, got 0"),
    ("n_heads", True, ValueError, "must be a positive int, got True"),
    ("n_heads", -2, ValueError, "must be a positive int, got -2"),
    ("dim_mlp", 8.0, ValueError, "must be a positive int, got 8.0"),
    ("dropout", 1.5, ValueError, "must be a float in [0, 1), got 1.5"),
    ("dropout", "0.1", TypeError, "must be a float in [0, 1), got '0.1'"),
    ("dropout", True, TypeError, "must be a float in [0, 1), got True"),
    ("attn_dropout", -0.1, ValueError, "must be a float in [0, 1), got -0.1"),
    ("attn_dropout", "0", TypeError, "must be a float in [0, 1), got '0'"),
    ("norm_eps", 0.0, ValueError, "must be a float > 0, got 0.0"),
    ("norm_eps", "1e-5", TypeError, "must be a float > 0, got '1e-5'"),
    ("activation", "swish", ValueError, "must be one of ('relu', 'gelu', 'gelu_tanh', "),
    ("norm", "sandwich", ValueError, "must be one of ('pre', 'post'), got 'sandwich'"),
    ("backend", "flash", ValueError, "must be one of ('auto', 'math', 'sdpa', 'varlen')"),
]


@pytest.mark.parametrize("argument,value,kind,wording", CASES)
def test_the_same_bad_value_gets_the_same_error_everywhere(argument, value, kind, wording):
    messages = []
    for build in builders(argument):
        with pytest.raises(kind) as caught:
            build(value)
        message = str(caught.value)
        assert argument in message and wording in message, message
        messages.append(message.split(argument, 1)[1])  # after the name: identical wording
    assert len(set(messages)) == 1, messages


def test_heads_must_divide_the_width_with_one_wording():
    messages = []
    for build in (
        lambda: EncoderConfig(d_model=18, n_heads=4),
        lambda: EncoderBlock(18, 4, 32),
        lambda: MultiHeadAttention(18, 18, 16, 16, 4),
    ):
        with pytest.raises(ValueError, match="must be divisible by n_heads") as caught:
            build()
        messages.append(str(caught.value).split("divisible", 1)[1].split(":", 1)[0])
    assert len(set(messages)) == 1
