"""GTE and nomic-bert (rotary BERTs with gated feed-forwards) against transformers' GteModel
and NomicBertModel and against sentence-transformers, from small random checkpoints written by
transformers: every layer's hidden states, every backend, left and right padding, batch
invariance, the round trip through transformers, and the configs the families refuse."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
import torch

from clearformer import TextEncoder
from clearformer.interop.hf import CheckpointError, load_model, save_model

from .family_helpers import (
    BACKENDS,
    TEXTS,
    assert_batch_invariant,
    perturb,
    sentence_dir,
    set_padding_side,
    st_encode,
    word_tokenizer,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
pytest.importorskip("sentence_transformers")

VOCAB = 48  # the word tokenizer's 45 pieces, and room
SIZES = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    intermediate_size=48,
    max_position_embeddings=128,
    pad_token_id=0,
)


def _gte(**overrides):
    config = transformers.GteConfig(**{**SIZES, "type_vocab_size": 1, **overrides})
    return transformers.GteModel(config)


def _nomic(**overrides):
    return transformers.NomicBertModel(transformers.NomicBertConfig(**{**SIZES, **overrides}))


BUILDERS = {"gte": _gte, "nomic_bert": _nomic}


def _write(path, model_type, **overrides):
    torch.manual_seed(0)
    model = BUILDERS[model_type](**overrides).eval()
    perturb(model, seed=7)
    model.save_pretrained(path)
    word_tokenizer(path, template="<bos> $A <eos>")
    return model


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def checkpoint(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    return request.param, path, _write(path, request.param)


def _batch(encoder, texts, side):
    encoder.tokenizer.padding_side = side
    try:
        return encoder.tokenize(texts)
    finally:
        encoder.tokenizer.padding_side = "right"


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_layer_matches_transformers(checkpoint, backend, side):
    model_type, path, hf = checkpoint
    encoder = TextEncoder.from_pretrained(path, backend=backend)
    assert encoder.report.architecture == model_type and not encoder.report.unexpected
    batch = _batch(encoder, TEXTS, side)
    ids, mask = batch.input_ids, batch.attention_mask
    assert (mask[:, -1] if side == "left" else mask[:, 0]).all()  # really padded that side
    with torch.no_grad():
        want = hf(
            input_ids=ids,
            attention_mask=mask.long(),
            token_type_ids=batch.token_type_ids,
            output_hidden_states=True,
        )
        got = encoder.model(ids, mask, batch.token_type_ids, output_hidden_states=True)
    assert len(got.hidden_states) == len(want.hidden_states) == 4
    for layer, (ours, theirs) in enumerate(zip(got.hidden_states, want.hidden_states, strict=True)):
        torch.testing.assert_close(ours[mask], theirs[mask], atol=1e-5, rtol=0, msg=f"{layer}")
    torch.testing.assert_close(
        got.last_hidden_state[mask], want.last_hidden_state[mask], atol=1e-5, rtol=0
    )
    assert (got.last_hidden_state[~mask] == 0).all()


@pytest.fixture(scope="module")
def st_dirs(checkpoint, tmp_path_factory):
    model_type, path, _ = checkpoint
    out = {}
    for side in ("right", "left"):
        set_padding_side(path, side)
        out[side] = sentence_dir(
            path, tmp_path_factory.mktemp(f"{model_type}-st-{side}"), normalize=True
        )
    set_padding_side(path, "right")
    return out


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_encode_equals_sentence_transformers(st_dirs, backend, side):
    path = st_dirs[side]
    ours = TextEncoder.from_pretrained(path, backend=backend)
    assert ours.tokenizer.padding_side == side
    np.testing.assert_allclose(ours.encode(TEXTS), st_encode(path, TEXTS), atol=1e-5, rtol=0)


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_each_text_alone_equals_it_in_the_batch(st_dirs, backend, side):
    assert_batch_invariant(TextEncoder.from_pretrained(st_dirs[side], backend=backend), TEXTS)


def test_round_trip_through_transformers(checkpoint, tmp_path):
    model_type, path, hf = checkpoint
    loaded = load_model(path)
    out = save_model(loaded.model, tmp_path / "saved", model_type, base_config=loaded.hf_config)
    back_hf = transformers.AutoModel.from_pretrained(out).eval()
    assert type(back_hf) is type(hf)
    ids = torch.randint(6, 44, (3, 9))
    mask = torch.ones(3, 9, dtype=torch.bool)
    mask[1, 5:] = False
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask.long()).last_hidden_state
        theirs = back_hf(input_ids=ids, attention_mask=mask.long()).last_hidden_state
        shutil.copy(path / "tokenizer.json", out)
        again = load_model(out).model(ids, mask)
    torch.testing.assert_close(theirs[mask], want[mask], atol=1e-6, rtol=0)
    torch.testing.assert_close(again[mask], want[mask], atol=1e-5, rtol=0)
    # config both ways: what clearformer reads from its own save is what it saved.
    assert load_model(out).model.config == loaded.model.config


def test_a_bias_the_layout_lacks_loads_as_zeros_and_must_stay_zero(checkpoint, tmp_path):
    model_type, path, _ = checkpoint
    model = load_model(path).model
    fc_in = model.encoder.layers[0].mlp.fc_in.bias
    assert (fc_in == 0).all()  # gate_proj and up_proj have no bias in either family
    with torch.no_grad():
        fc_in.add_(0.1)
    with pytest.raises(CheckpointError, match=r"mlp.fc_in.bias is not all zeros"):
        save_model(model, tmp_path / "x", model_type)
    assert not (tmp_path / "x" / "config.json").exists()


def test_gte_without_token_types(tmp_path):
    hf = _write(tmp_path, "gte", type_vocab_size=0)
    encoder = TextEncoder.from_pretrained(tmp_path)
    assert encoder.config.type_vocab_size == 0
    batch = encoder.tokenize(TEXTS)
    with torch.no_grad():
        want = hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask.long())
        got = encoder.model(batch.input_ids, batch.attention_mask)
    mask = batch.attention_mask
    torch.testing.assert_close(got[mask], want.last_hidden_state[mask], atol=1e-5, rtol=0)


def test_gte_classifier_matches_transformers(tmp_path):
    from clearformer import CrossEncoder

    torch.manual_seed(0)
    config = transformers.GteConfig(**{**SIZES, "type_vocab_size": 1, "num_labels": 1})
    hf = transformers.GteForSequenceClassification(config).eval()
    perturb(hf, seed=3)
    hf.save_pretrained(tmp_path)
    word_tokenizer(tmp_path, template="<bos> $A <eos> $B <eos>")
    ours = CrossEncoder.from_pretrained(tmp_path)
    pairs = [("the cat", "sat on the mat"), ("hello", "world is one two three")]
    encodings = ours.tokenizer.encode_pairs(pairs)
    batch = ours.tokenizer.pad(encodings, with_tokens=False)
    with torch.no_grad():
        want = hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask.long()).logits
    np.testing.assert_allclose(
        ours.predict(pairs, activation="identity"), want[:, 0].numpy(), atol=1e-5, rtol=0
    )


def _config(path):
    return json.loads((path / "config.json").read_text())


@pytest.mark.parametrize(
    "model_type, change, message",
    [
        ("nomic_bert", {"moe_every_n_layers": 2, "num_experts": 8}, "'moe_every_n_layers'=2"),
        ("nomic_bert", {"n_embd": 32}, r"remote-code field names \['n_embd'\]"),
        ("gte", {"rope_parameters": {"rope_type": "ntk", "factor": 2.0}}, "'rope_type'.*'ntk'"),
        ("gte", {"rope_scaling": {"type": "ntk", "factor": 2.0}}, "'rope_scaling' must be null"),
        ("gte", {"head_dim": 16}, "'head_dim' must be hidden_size / num_attention_heads = 8"),
        ("nomic_bert", {"hidden_act": "relu"}, "'hidden_act'='relu'"),
        ("gte", {"num_attention_heads": 5}, "'hidden_size'=32 must be divisible"),
    ],
)
def test_unsupported_configs_name_the_field(tmp_path, model_type, change, message):
    _write(tmp_path, model_type)
    (tmp_path / "config.json").write_text(json.dumps({**_config(tmp_path), **change}))
    with pytest.raises(CheckpointError, match=message) as info:
        TextEncoder.from_pretrained(tmp_path)
    assert str(tmp_path / "config.json") in str(info.value)


def test_unsupported_config_on_the_cli_is_one_line(tmp_path):
    import subprocess
    import sys

    _write(tmp_path, "nomic_bert")
    config = {**_config(tmp_path), "moe_every_n_layers": 2}
    (tmp_path / "config.json").write_text(json.dumps(config))
    done = subprocess.run(
        [sys.executable, "-m", "clearformer", "encode", "--model", str(tmp_path), "hello"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "moe_every_n_layers" in done.stderr and len(done.stderr.splitlines()) == 1


def test_left_padding_without_a_pad_token_names_the_files(tmp_path):
    _write(tmp_path, "gte", pad_token_id=None)
    word_tokenizer(tmp_path, template="<bos> $A <eos>", pad_token=None, padding_side="left")
    with pytest.raises(CheckpointError, match="left padding needs a pad token") as info:
        TextEncoder.from_pretrained(tmp_path)
    assert "'pad_token'" in str(info.value) and "'pad_token_id'" in str(info.value)
    assert TextEncoder.from_pretrained(tmp_path, padding_side="right").tokenizer.padding_side


def test_lora_adapters_are_refused_naming_the_field(tmp_path):
    """jina-embeddings-v3 is an XLM-R config with LoRA adapters: not a plain encoder."""
    from .test_pretrained_checkpoints import make_checkpoint

    make_checkpoint("roberta", tmp_path)
    config = _config(tmp_path)
    adapters = ["retrieval.query", "retrieval.passage"]
    config.update(model_type="xlm-roberta", lora_adaptations=adapters)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="'lora_adaptations'=.*LoRA adapters") as info:
        TextEncoder.from_pretrained(tmp_path)
    assert str(tmp_path / "config.json") in str(info.value)
