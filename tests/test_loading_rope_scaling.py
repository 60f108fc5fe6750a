"""A legacy ``rope_scaling`` of type "default" is plain rotary positions, as transformers 5
reads it; one that scales the positions is still refused, naming the field."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from clearformer import TextEncoder
from clearformer.interop.hf import CheckpointError, family_for

from .family_helpers import TEXTS, perturb, word_tokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

DEFAULTS = [{"rope_type": "default"}, {"type": "default"}, {"rope_type": "default", "factor": 1.0}]
SCALED = [{"rope_type": "linear", "factor": 2.0}, {"type": "yarn", "factor": 4.0}]


def _qwen3(directory: Path, rope_scaling) -> Path:
    """A small random Qwen3Model whose config.json has the legacy rotary fields: ``rope_theta``
    (not the default 10,000, so a base read wrong shows) and ``rope_scaling``."""
    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(
        vocab_size=48,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=24,
        max_position_embeddings=128,
        pad_token_id=0,
    )
    model = transformers.Qwen3Model(cfg).eval()
    perturb(model, seed=5)
    model.save_pretrained(directory)
    word_tokenizer(directory, template="$A <eos>", padding_side="left")
    config = json.loads((directory / "config.json").read_text())
    config.pop("rope_parameters", None)
    config.update(rope_theta=5000.0, rope_scaling=rope_scaling)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


@pytest.mark.parametrize("rope_scaling", DEFAULTS, ids=json.dumps)
def test_qwen3_default_rope_scaling_matches_transformers(tmp_path, rope_scaling):
    directory = _qwen3(tmp_path, rope_scaling)
    reference = transformers.AutoModel.from_pretrained(str(directory)).eval()
    encoder = TextEncoder.from_pretrained(directory)
    assert encoder.config.rope_theta == 5000.0
    batch = encoder.tokenize(TEXTS)
    mask = batch.attention_mask
    with torch.no_grad():
        want = reference(input_ids=batch.input_ids, attention_mask=mask.long()).last_hidden_state
        got = encoder.model(batch.input_ids, mask)
    torch.testing.assert_close(got[mask], want[mask], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("rope_scaling", SCALED, ids=json.dumps)
def test_qwen3_scaled_rope_is_refused(tmp_path, rope_scaling):
    directory = _qwen3(tmp_path, rope_scaling)
    with pytest.raises(CheckpointError, match=r"config\.json.*'rope_scaling' must be null or"):
        TextEncoder.from_pretrained(directory)


def _small(config_class, **fields) -> dict:
    return getattr(transformers, config_class)(
        vocab_size=48,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=128,
        pad_token_id=0,
        **fields,
    ).to_dict()


@pytest.mark.parametrize("config_class", ["GteConfig", "NomicBertConfig", "ModernBertConfig"])
def test_encoder_families_read_default_rope_scaling_as_absent(config_class):
    hf = _small(config_class)
    family = family_for(hf)
    plain = family.encoder_config(hf, backend="auto")
    for rope_scaling in DEFAULTS:
        assert family.encoder_config({**hf, "rope_scaling": rope_scaling}, backend="auto") == plain
    for rope_scaling in SCALED:
        with pytest.raises(CheckpointError, match="'rope_scaling' must be null or"):
            family.encoder_config({**hf, "rope_scaling": rope_scaling}, backend="auto")
