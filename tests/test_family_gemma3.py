"""Gemma3 text with bidirectional attention (EmbeddingGemma) as clearformer loads it: every
layer against transformers' Gemma3TextModel, EmbeddingGemma's sentence-transformers stack
(mean pooling, Dense up and down, Normalize, prompts, Matryoshka cuts) against
sentence-transformers, on small random checkpoints, every backend, left and right padding."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest
import torch

from clearformer import EncoderModel, TextEncoder
from clearformer.interop.hf import CheckpointError, load_model, save_model
from clearformer.interop.hf.mapping import load_state

from .family_helpers import (
    BACKENDS,
    TEXTS,
    assert_batch_invariant,
    perturb,
    sentence_dir,
    st_encode,
    word_tokenizer,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
pytest.importorskip("sentence_transformers")

# EmbeddingGemma's prompts (a few of them), and its 768 -> 3072 -> 768 at width 64.
PROMPTS = {"query": "task: search result | query: ", "document": "title: none | text: "}
DENSE = [(64, 256, False, None), (256, 64, False, None)]


def gemma3_config(**overrides):
    fields = dict(
        vocab_size=48,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=24,
        query_pre_attn_scalar=20,  # the scores' scale is not the head width's
        max_position_embeddings=128,
        sliding_window=4,  # shorter than most TEXTS: the local layers see a window
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        use_bidirectional_attention=True,
        pad_token_id=0,
    )
    return transformers.Gemma3TextConfig(**{**fields, **overrides})


def write(path, side="right", **overrides):
    torch.manual_seed(0)
    model = transformers.Gemma3TextModel(gemma3_config(**overrides)).eval()
    perturb(model, seed=5)
    model.save_pretrained(path)
    word_tokenizer(path, template="<bos> $A <eos>", padding_side=side)
    return model


@pytest.fixture(scope="module", params=[1, 2, 4], ids=lambda n: f"kv{n}")
def checkpoint(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(f"gemma3-kv{request.param}")
    return path, write(path, num_key_value_heads=request.param)


def hidden(hf, ids, mask):
    with torch.no_grad():
        return hf(input_ids=ids, attention_mask=mask.long(), output_hidden_states=True)


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_layer_matches_transformers(checkpoint, backend, side):
    path, hf = checkpoint
    encoder = TextEncoder.from_pretrained(path, backend=backend, padding_side=side)
    config = encoder.config
    assert not config.causal and config.layer_types == ("local", "local", "global")
    assert config.norm_unit_offset and config.branch_norm and config.scale_embeddings
    assert config.local_window == 4 and config.local_rope_theta == 10_000.0
    batch = encoder.tokenize(TEXTS)
    ids, mask = batch.input_ids, batch.attention_mask
    want = hidden(hf, ids, mask)
    with torch.no_grad():
        got = encoder.model(ids, mask, output_hidden_states=True)
    assert len(got.hidden_states) == len(want.hidden_states) == config.n_layers + 1
    for layer in range(config.n_layers):
        torch.testing.assert_close(
            got.hidden_states[layer][mask], want.hidden_states[layer][mask], atol=1e-5, rtol=0
        )
    torch.testing.assert_close(
        got.last_hidden_state[mask], want.last_hidden_state[mask], atol=1e-5, rtol=0
    )
    assert (got.last_hidden_state[~mask] == 0).all()


def _twin(path, **changes):
    """The checkpoint's model with some config fields changed, its weights loaded as they are
    (what a family that read the config wrongly would run)."""
    loaded = load_model(path)
    twin = EncoderModel(dataclasses.replace(loaded.model.config, **changes)).eval()
    load_state(twin, loaded.model.state_dict(), _identity_family(loaded.architecture))
    return loaded.model, twin


def _identity_family(family):
    """A family whose names are clearformer's own: the state dict loads as it is."""
    return dataclasses.replace(
        family,
        base_prefix="\x00",
        config_names=lambda config: [
            (name, (name,)) for name, _ in EncoderModel(config).named_parameters()
        ],
    )


@pytest.mark.parametrize(
    "changes",
    [
        {"norm_unit_offset": False},  # Gemma's norms scale by 1 + weight
        {"causal": True},  # EmbeddingGemma attends both ways
        {"scale_embeddings": False},  # Gemma multiplies the embeddings by sqrt(D)
        {"attn_scale": None},  # query_pre_attn_scalar ** -0.5, not the head width's
    ],
    ids=lambda c: next(iter(c)),
)
def test_negative_controls_each_field_matters(checkpoint, changes):
    path, hf = checkpoint
    model, twin = _twin(path, **changes)
    encoder = TextEncoder.from_pretrained(path)
    batch = encoder.tokenize(TEXTS)
    ids, mask = batch.input_ids, batch.attention_mask
    want = hidden(hf, ids, mask).last_hidden_state
    with torch.no_grad():
        right, wrong = model(ids, mask), twin(ids, mask)
    torch.testing.assert_close(right[mask], want[mask], atol=1e-5, rtol=0)
    assert (wrong[mask] - want[mask]).abs().max() > 1e-3


@pytest.fixture(scope="module")
def embedding_dirs(tmp_path_factory):
    """EmbeddingGemma's sentence-transformers stack, one directory per padding side."""
    out = {}
    for side in ("right", "left"):
        base = tmp_path_factory.mktemp(f"gemma3-base-{side}")
        write(base, side=side)
        out[side] = sentence_dir(
            base,
            tmp_path_factory.mktemp(f"gemma3-st-{side}"),
            pooling="mean",
            dense=DENSE,
            normalize=True,
            prompts=PROMPTS,
        )
    return out


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_embeddings_equal_sentence_transformers(embedding_dirs, backend, side):
    path = embedding_dirs[side]
    ours = TextEncoder.from_pretrained(path, backend=backend)
    assert ours.tokenizer.padding_side == side and ours.dim == 64 and ours.normalize
    assert [s.out_features for s in ours.head.config.steps] == [256, 64]
    np.testing.assert_allclose(ours.encode(TEXTS), st_encode(path, TEXTS), atol=1e-5, rtol=0)
    for name in PROMPTS:
        got = ours.encode(TEXTS, prompt_name=name)
        np.testing.assert_allclose(got, st_encode(path, TEXTS, prompt_name=name), atol=1e-5)
    for dims in (8, 32):
        want = st_encode(path, TEXTS, truncate_dim=dims, normalize_embeddings=True)
        np.testing.assert_allclose(ours.encode(TEXTS, dimensions=dims), want, atol=1e-5)


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_each_text_alone_equals_it_in_the_batch(embedding_dirs, backend, side):
    ours = TextEncoder.from_pretrained(embedding_dirs[side], backend=backend)
    assert_batch_invariant(ours, TEXTS)
    assert_batch_invariant(ours, TEXTS, prompt_name="query", dimensions=32)


def test_round_trip_through_transformers(checkpoint, tmp_path):
    path, hf = checkpoint
    loaded = load_model(path)
    out = save_model(loaded.model, tmp_path / "saved", "gemma3_text", base_config=loaded.hf_config)
    saved = json.loads((out / "config.json").read_text())
    assert saved["sliding_window"] == 4 and saved["use_bidirectional_attention"] is True
    back = transformers.AutoModel.from_pretrained(out).eval()
    assert type(back) is type(hf) and back.config.sliding_window == hf.config.sliding_window
    ids = torch.randint(6, 44, (3, 11))
    mask = torch.ones(3, 11, dtype=torch.bool)
    mask[2, 7:] = False
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask.long()).last_hidden_state
        theirs = back(input_ids=ids, attention_mask=mask.long()).last_hidden_state
    torch.testing.assert_close(theirs[mask], want[mask], atol=1e-6, rtol=0)
    (out / "tokenizer.json").write_bytes((path / "tokenizer.json").read_bytes())
    again = load_model(out)
    assert again.model.config == loaded.model.config
    with torch.no_grad():
        torch.testing.assert_close(again.model(ids, mask)[mask], want[mask], atol=1e-5, rtol=0)


def test_causal_gemma3_matches_transformers(tmp_path):
    """use_bidirectional_attention false: causal, with a causal sliding window."""
    hf = write(tmp_path, use_bidirectional_attention=False)
    encoder = TextEncoder.from_pretrained(tmp_path, backend="varlen")
    assert encoder.config.causal and encoder.config.local_window == 4
    batch = encoder.tokenize(TEXTS)
    mask = batch.attention_mask
    want = hidden(hf, batch.input_ids, mask).last_hidden_state
    with torch.no_grad():
        got = encoder.model(batch.input_ids, mask)
    torch.testing.assert_close(got[mask], want[mask], atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"attn_logit_softcapping": 50.0}, "'attn_logit_softcapping' must be null"),
        ({"hidden_activation": "gelu"}, "'hidden_activation' must be 'gelu_pytorch_tanh'"),
        ({"layer_types": ["sliding_attention"]}, "'layer_types' must list 3"),
        ({"sliding_window": None}, "'sliding_window'"),
        (
            {"rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0}}},
            r"rope_parameters\['full_attention'\]\['rope_type'\]",
        ),
    ],
)
def test_unsupported_configs_name_the_field(tmp_path, change, message):
    write(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(CheckpointError, match=message) as info:
        TextEncoder.from_pretrained(tmp_path)
    assert str(tmp_path / "config.json") in str(info.value)


def test_cli_encode_dimensions_on_embeddinggemma(embedding_dirs, tmp_path):
    import subprocess
    import sys

    path, out = embedding_dirs["right"], tmp_path / "e.jsonl"
    command = [sys.executable, "-m", "clearformer", "encode", "--model", str(path)]
    done = subprocess.run(
        [*command, "--dimensions", "32", "-o", str(out), *TEXTS[:3]],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    got = np.array([json.loads(line)["embedding"] for line in out.read_text().splitlines()])
    want = st_encode(path, TEXTS[:3], truncate_dim=32, normalize_embeddings=True)
    np.testing.assert_allclose(got, want, atol=1e-5)
    bad = subprocess.run(
        [*command, "--dimensions", "65", "hello"], capture_output=True, text=True, timeout=300
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "--dimensions must be in [1, 64]" in bad.stderr
