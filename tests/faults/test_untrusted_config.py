"""config.json is untrusted: every field that sizes the model or is read as a number is
checked (type and plausible range) before anything is built, and the error names the file
and the field."""

from __future__ import annotations

import pytest

from clearformer.interop.hf import CheckpointError, load_model, loading

from .conftest import edit_config


@pytest.fixture
def no_model_built(monkeypatch):
    """Fail the test if a model is allocated: every check must come before it."""

    def refuse(config):
        raise AssertionError(f"a model was built for {config}")

    monkeypatch.setattr(loading, "EncoderModel", refuse)


@pytest.mark.parametrize(
    ("changes", "wording"),
    [
        ({"vocab_size": 10**10}, "'vocab_size' must be an int in [1, 2,097,152], got 10000000000"),
        ({"vocab_size": 1e10}, "'vocab_size' must be an int in [1, 2,097,152], got 10000000000.0"),
        ({"num_hidden_layers": 10**6}, "'num_hidden_layers' must be an int in [1, 512]"),
        ({"hidden_size": 0}, "'hidden_size' must be an int in [1, 16,384], got 0"),
        ({"intermediate_size": "32"}, "'intermediate_size' must be an int in [1, 131,072]"),
        ({"max_position_embeddings": 10**9}, "'max_position_embeddings' must be an int in"),
        ({"num_attention_heads": 3}, "'hidden_size'=16 must be divisible by"),
        ({"pad_token_id": 1.5}, "'pad_token_id' must be null or an int in [0, 10)"),
        ({"pad_token_id": 10}, "'pad_token_id' must be null or an int in [0, 10) (vocab_size)"),
        ({"type_vocab_size": None}, "'type_vocab_size' must be an int in [0, 1,024], got None"),
        ({"hidden_dropout_prob": "0.1"}, "'hidden_dropout_prob' must be a number, got '0.1'"),
        ({"attention_probs_dropout_prob": 1.5}, "'attention_probs_dropout_prob' must be in"),
        ({"layer_norm_eps": None}, "'layer_norm_eps' must be a number, got None"),
        (
            {"hidden_size": 16_384, "num_attention_heads": 16, "num_hidden_layers": 512},
            "describes a model of",
        ),
    ],
)
def test_bad_sizing_or_numeric_field_names_file_and_field(
    checkpoint, no_model_built, changes, wording
):
    edit_config(checkpoint, **changes)
    with pytest.raises(CheckpointError) as info:
        load_model(checkpoint)
    message = str(info.value)
    assert wording in message, message
    assert str(checkpoint / "config.json") in message, message


@pytest.mark.parametrize(
    ("changes", "wording"),
    [
        ({"dim": 10**7}, "'dim' must be an int in [1, 16,384]"),
        ({"n_layers": True}, "'n_layers' must be an int in [1, 512], got True"),
        ({"dropout": [0.1]}, "'dropout' must be a number, got [0.1]"),
        ({"pad_token_id": -1}, "'pad_token_id' must be null or an int in [0, 30522)"),
    ],
)
def test_distilbert_fields_are_checked_too(changes, wording):
    from clearformer.interop.hf.families import FAMILIES

    hf = {
        "model_type": "distilbert",
        "dim": 16,
        "n_heads": 2,
        "n_layers": 1,
        "hidden_dim": 32,
        "vocab_size": 30522,
        "max_position_embeddings": 32,
        **changes,
    }
    with pytest.raises(CheckpointError, match="config.json") as info:
        FAMILIES["distilbert"].encoder_config(hf)
    assert wording in str(info.value), str(info.value)


def test_roberta_pad_must_leave_positions(checkpoint, no_model_built):
    edit_config(checkpoint, model_type="roberta", pad_token_id=5, max_position_embeddings=6)
    with pytest.raises(CheckpointError, match="leaves no position after 'pad_token_id'=5"):
        load_model(checkpoint)


def test_the_tiny_checkpoint_itself_loads(checkpoint):
    assert load_model(checkpoint).report.complete
