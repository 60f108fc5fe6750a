"""``EncoderConfig`` refuses values of the wrong type instead of reading them as truth values
or indices: TypeError for a wrong type, ValueError for a wrong value, naming the field."""

from __future__ import annotations

import pytest

from clearformer import EncoderConfig


@pytest.mark.parametrize(
    ("kwargs", "wording"),
    [
        ({"checkpointing": "no"}, "checkpointing must be a bool (True or False), got 'no'"),
        ({"bias": "yes"}, "bias must be a bool (True or False), got 'yes'"),
        ({"bias": 1}, "bias must be a bool (True or False), got 1"),
        ({"final_norm": "x"}, "final_norm must be a bool (True or False) or None, got 'x'"),
        ({"embedding_norm": 0}, "embedding_norm must be a bool (True or False), got 0"),
        (
            {"positions": 1},
            "positions must be one of ('learned', 'sinusoidal', 'rotary', 'none'), got 1",
        ),
        ({"vocab_size": 10, "pad_token_id": 1.5}, "pad_token_id must be an int in [0, 10)"),
        ({"pad_token_id": "0"}, "pad_token_id must be an int >= 0 or None, got '0'"),
        ({"pad_token_id": True}, "pad_token_id must be an int >= 0 or None, got True"),
        ({"type_vocab_size": None}, "type_vocab_size must be an int >= 0, got None"),
        ({"type_vocab_size": 2.0}, "type_vocab_size must be an int >= 0, got 2.0"),
        ({"position_offset": "1"}, "position_offset must be an int in [0, 512)"),
        ({"position_offset": 1.0}, "position_offset must be an int in [0, 512)"),
    ],
)
def test_a_wrong_type_is_a_type_error_naming_the_field(kwargs, wording):
    with pytest.raises(TypeError) as info:
        EncoderConfig(**kwargs)
    assert f"EncoderConfig.{wording}" in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "wording"),
    [
        ({"vocab_size": 10, "pad_token_id": 10}, "pad_token_id must be an int in [0, 10)"),
        ({"pad_token_id": -1}, "pad_token_id must be an int >= 0 or None, got -1"),
        ({"type_vocab_size": -1}, "type_vocab_size must be an int >= 0, got -1"),
    ],
)
def test_a_wrong_value_is_a_value_error_naming_the_field(kwargs, wording):
    with pytest.raises(ValueError) as info:
        EncoderConfig(**kwargs)
    assert not isinstance(info.value, TypeError)
    assert f"EncoderConfig.{wording}" in str(info.value)


def test_a_wrong_int_type_is_still_caught_as_value_error():
    """Earlier versions raised ValueError for ``d_model=8.0``; code catching it keeps working."""
    from clearformer.checks import ArgumentTypeError

    with pytest.raises(ArgumentTypeError) as info:
        EncoderConfig(d_model=8.0)
    assert isinstance(info.value, TypeError) and isinstance(info.value, ValueError)


def test_good_values_are_kept():
    config = EncoderConfig(
        bias=False, checkpointing=True, final_norm=None, vocab_size=10, pad_token_id=None
    )
    assert (config.bias, config.checkpointing, config.pad_token_id) == (False, True, None)
