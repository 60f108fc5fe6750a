"""Checkpoint families: each one's config and weights round-trip with transformers, configs it
cannot express are refused clearly, and the registry is open to new families."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from clearformer import EncoderConfig, EncoderModel
from clearformer.interop.hf import (
    FAMILIES,
    CheckpointError,
    Family,
    family_for,
    family_named,
    load_model,
    register,
    save_model,
)
from clearformer.interop.hf import families as registry
from clearformer.interop.hf.families import bert
from clearformer.interop.hf.weights import read_tensors

from .test_pretrained_checkpoints import make_checkpoint

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

# config.json fields each family reads and writes; the rest of a config is kept as it was.
BERT_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_attention_heads",
    "num_hidden_layers",
    "intermediate_size",
    "hidden_act",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "max_position_embeddings",
    "type_vocab_size",
    "layer_norm_eps",
    "pad_token_id",
    "position_embedding_type",
)
DISTILBERT_FIELDS = (
    "vocab_size",
    "dim",
    "n_heads",
    "n_layers",
    "hidden_dim",
    "max_position_embeddings",
    "activation",
    "dropout",
    "attention_dropout",
    "pad_token_id",
    "sinusoidal_pos_embds",
)
SMALL_BERT = {
    "vocab_size": 50,
    "hidden_size": 48,
    "num_hidden_layers": 3,
    "num_attention_heads": 6,
    "intermediate_size": 80,
    "max_position_embeddings": 40,
}
CONFIGS = [
    ("bert", transformers.BertConfig, {**SMALL_BERT}, BERT_FIELDS),
    (
        "bert",
        transformers.BertConfig,
        {
            **SMALL_BERT,
            "hidden_act": "gelu_new",
            "layer_norm_eps": 1e-7,
            "hidden_dropout_prob": 0.2,
            "attention_probs_dropout_prob": 0.05,
            "type_vocab_size": 3,
        },
        BERT_FIELDS,
    ),
    ("bert", transformers.BertConfig, {**SMALL_BERT, "hidden_act": "relu"}, BERT_FIELDS),
    (
        "roberta",
        transformers.RobertaConfig,
        {**SMALL_BERT, "pad_token_id": 1, "type_vocab_size": 1, "layer_norm_eps": 1e-5},
        BERT_FIELDS,
    ),
    (
        "distilbert",
        transformers.DistilBertConfig,
        {"vocab_size": 50, "dim": 48, "n_layers": 3, "n_heads": 6, "hidden_dim": 80},
        DISTILBERT_FIELDS,
    ),
    (
        "distilbert",
        transformers.DistilBertConfig,
        {"dim": 32, "n_heads": 4, "activation": "relu", "dropout": 0.3, "attention_dropout": 0.0},
        DISTILBERT_FIELDS,
    ),
]


@pytest.mark.parametrize(("model_type", "cls", "kwargs", "fields"), CONFIGS)
def test_config_round_trip_through_transformers(model_type, cls, kwargs, fields):
    written = cls(**kwargs).to_dict()  # as transformers writes config.json
    family = family_for(written)
    assert family.model_type == model_type
    config = family.encoder_config(written)
    assert config.norm == "post" and config.embedding_norm and not config.final_norm
    back = family.hf_config(config, None)  # no base config: every field comes from ``config``
    assert back["model_type"] == model_type and back["architectures"] == [family.hf_class]
    # (transformers 5 no longer writes position_embedding_type; clearformer writes "absolute")
    shared = [k for k in fields if k in written]
    assert {k: back[k] for k in shared} == {k: written[k] for k in shared}
    # transformers reads the written config back to the same fields, and so does clearformer
    reread = cls(**back).to_dict()
    assert {k: reread[k] for k in shared} == {k: written[k] for k in shared}
    assert family.encoder_config(back) == config


def test_roberta_positions_start_after_the_pad_token():
    written = transformers.RobertaConfig(**SMALL_BERT, pad_token_id=1).to_dict()
    config = family_for(written).encoder_config(written)
    assert (config.pad_token_id, config.position_offset) == (1, 2)
    assert family_for(written).hf_config(config, None)["max_position_embeddings"] == 40


@pytest.mark.parametrize("kind", ["bert", "roberta", "distilbert"])
def test_weights_round_trip_through_transformers(tmp_path, kind):
    source, saved = tmp_path / "source", tmp_path / "saved"
    source.mkdir()
    reference = make_checkpoint(kind, source)
    loaded = load_model(source)
    assert loaded.report.complete and loaded.architecture.model_type == kind
    save_model(loaded.model, saved, kind, base_config=loaded.hf_config, kept=loaded.kept)
    tokenizer = loaded.files.tokenizer  # load_model checks for one; save_model writes weights only
    (saved / tokenizer.name).write_bytes(tokenizer.read_bytes())
    # every tensor transformers wrote comes back identical (q, k, v split from in_proj exactly)
    original, written = (
        read_tensors(source / "model.safetensors"),
        read_tensors(saved / "model.safetensors"),
    )
    for name, value in written.items():
        assert torch.equal(value, original[name]), name
    again = load_model(saved)
    assert again.report.complete and again.model.config == loaded.model.config
    for name, value in loaded.model.state_dict().items():
        assert torch.equal(value, again.model.state_dict()[name]), name
    # and transformers runs the saved checkpoint to the same outputs
    hf = transformers.AutoModel.from_pretrained(str(saved)).eval()
    ids = torch.tensor([[2, 5, 6, 7, 8, 3], [2, 9, 10, 3, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    with torch.no_grad():
        ours = again.model(ids, mask.bool())
        for model in (reference, hf):
            theirs = model(input_ids=ids, attention_mask=mask).last_hidden_state
            torch.testing.assert_close(ours[mask.bool()], theirs[mask.bool()], atol=1e-5, rtol=1e-5)


BERT_LAYOUT = ("bert", "distilbert", "roberta")  # post-norm, plain feed-forward


@pytest.mark.parametrize("activation", ["swiglu", "geglu"])
@pytest.mark.parametrize("model_type", BERT_LAYOUT)
def test_gated_activations_cannot_be_saved(tmp_path, model_type, activation):
    config = EncoderConfig(
        d_model=16, n_heads=2, n_layers=1, dim_mlp=32, vocab_size=10, activation=activation
    )
    with pytest.raises(
        CheckpointError,
        match=rf"activation must be one of gelu, gelu_tanh, relu to save a {model_type} "
        rf"checkpoint .*got activation='{activation}'",
    ):
        FAMILIES[model_type].hf_config(config, None)
    with pytest.raises(CheckpointError, match="activation must be one of"):
        save_model(EncoderModel(config), tmp_path / "out", model_type)
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_a_bert_shaped_model_cannot_be_saved_as_modernbert(tmp_path):
    config = EncoderConfig(d_model=16, n_heads=2, n_layers=1, dim_mlp=32, vocab_size=10)
    with pytest.raises(CheckpointError, match="a ModernBERT checkpoint needs norm='pre'"):
        save_model(EncoderModel(config), tmp_path / "out", "modernbert")
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_unknown_model_type_lists_the_supported_ones():
    with pytest.raises(
        CheckpointError,
        match=r"unsupported architecture model_type='gpt2' in my/config\.json; "
        r"supported: bert, distilbert, gemma3_text, gte, modernbert, mpnet, nomic_bert, qwen3, "
        r"roberta",
    ):
        family_for({"model_type": "gpt2"}, "my/config.json")
    with pytest.raises(CheckpointError, match="model_type=None"):
        family_for({})
    with pytest.raises(CheckpointError, match=r"model_type='bart' in save_model"):
        save_model(EncoderModel(EncoderConfig(d_model=8, n_heads=2, vocab_size=5)), ".", "bart")


def _toy_family() -> Family:
    """BERT's layout under another model_type and prefix: a family defined outside the registry."""
    return dataclasses.replace(bert.BERT, model_type="toy-bert", base_prefix="toy.")


def test_a_registered_family_is_found_and_loads(tmp_path):
    toy = _toy_family()
    with pytest.raises(CheckpointError, match="toy-bert"):
        family_for({"model_type": "toy-bert"})
    register(toy)
    try:
        assert family_for({"model_type": "toy-bert"}) is toy
        assert family_named("toy-bert") is toy and "toy-bert" in FAMILIES
        model = EncoderModel(family_for({"model_type": "bert"}).encoder_config(SMALL_BERT))
        save_model(model, tmp_path, "toy-bert")
        (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n", encoding="utf-8")
        loaded = load_model(tmp_path)
        assert loaded.architecture is toy and loaded.report.architecture == "toy-bert"
        for name, value in model.state_dict().items():
            assert torch.equal(value, loaded.model.state_dict()[name]), name
    finally:
        registry._REGISTRY.pop("toy-bert", None)
    assert "toy-bert" not in FAMILIES


def test_register_refuses_duplicates_and_non_families():
    with pytest.raises(ValueError, match="model_type='bert' is registered already"):
        register(dataclasses.replace(bert.BERT))
    with pytest.raises(TypeError, match="family must be a Family, got dict"):
        register({"model_type": "x"})
    with pytest.raises(ValueError, match="non-empty str"):
        register(dataclasses.replace(bert.BERT, model_type=""))
    assert register(bert.BERT, replace=True) is bert.BERT
    assert FAMILIES["bert"] is bert.BERT


@pytest.mark.parametrize(
    ("model_type", "cls", "kwargs", "fields"), [CONFIGS[0], CONFIGS[3], CONFIGS[4]]
)
def test_name_tables_cover_the_model_exactly(model_type, cls, kwargs, fields):
    family = FAMILIES[model_type]
    config = family.encoder_config(cls(**kwargs).to_dict())
    table = family.name_table(config.n_layers)
    targets = [target for target, _ in table]
    assert len(targets) == len(set(targets)) and set(targets) == set(
        dict(EncoderModel(config).named_parameters())
    )
    sources = [source for _, group in table for source in group]
    assert len(sources) == len(set(sources))  # each Hugging Face tensor feeds one parameter
    fused = [group for _, group in table if len(group) > 1]
    assert len(fused) == 2 * config.n_layers and all(len(g) == 3 for g in fused)  # q; k; v


def test_roberta_positions_skip_a_pad_id_inside_a_text(tmp_path):
    """transformers counts a RoBERTa token's position over the ids before it that are not the
    pad id (a literal "<pad>" in a text): padded on either side and packed, clearformer
    agrees; a text without one is untouched."""
    source = tmp_path / "roberta"
    source.mkdir()
    make_checkpoint("roberta", source)
    model = load_model(source).model.eval()
    hf = transformers.AutoModel.from_pretrained(str(source)).eval()
    pad = model.config.pad_token_id
    texts = [[0, 5, pad, 6, pad, 7, 2], [0, pad, 9, 2], [0, 5, 6, 2]]
    with torch.no_grad():
        want = [hf(input_ids=torch.tensor([t])).last_hidden_state[0] for t in texts]
        T = max(map(len, texts))
        for side in ("right", "left"):
            ids = torch.full((len(texts), T), pad)
            mask = torch.zeros(len(texts), T, dtype=torch.bool)
            for b, t in enumerate(texts):
                at = slice(0, len(t)) if side == "right" else slice(T - len(t), T)
                ids[b, at], mask[b, at] = torch.tensor(t), True
            out = model(ids, mask)
            for b in range(len(texts)):
                torch.testing.assert_close(out[b][mask[b]], want[b], atol=1e-5, rtol=1e-5)
        packed = torch.tensor([i for t in texts for i in t])
        cu = torch.tensor([0, 7, 11, 15], dtype=torch.int32)
        out = model(packed, cu_seqlens=cu)
        for b in range(len(texts)):
            torch.testing.assert_close(out[cu[b] : cu[b + 1]], want[b], atol=1e-5, rtol=1e-5)
        # Negative control: positions 0 .. n-1 regardless of the pad ids are another answer.
        plain = model.embeddings(torch.tensor([texts[0]]))
        hf_embeddings = hf.embeddings(input_ids=torch.tensor([texts[0]]))
        assert not torch.allclose(plain, hf_embeddings, atol=1e-3)
