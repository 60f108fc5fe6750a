"""BERT, RoBERTa and DistilBERT checkpoints written by transformers load with equal outputs,
and clearformer's saved checkpoints load back in transformers with equal outputs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from clearformer import TextEncoder

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

_WORD_TEXT = (
    "the a cat dog sat on mat and ran far away quick brown fox jumps over lazy "
    "hello world is this text one two three four five"
)
WORDS = _WORD_TEXT.split()
TEXTS = [
    "the cat sat on the mat",
    "hello",
    "",
    "quick brown fox jumps over the lazy dog and the cat ran far far away " * 3,
    "unknownword the dog",
]


def _wordpiece_vocab(directory: Path) -> None:
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    (directory / "vocab.txt").write_text("\n".join(specials + WORDS) + "\n", encoding="utf-8")


def _wordlevel_tokenizer(directory: Path) -> None:
    """A RoBERTa-style tokenizer: <s> text </s>, pad id 1."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {t: i for i, t in enumerate(["<s>", "<pad>", "</s>", "<unk>", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<s>", "<pad>", "</s>", "<unk>"])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
    )
    tok.save(str(directory / "tokenizer.json"))


def _perturb(model: torch.nn.Module, seed: int) -> None:
    """Move every parameter off its initial value, so LayerNorm ones/zeros cannot hide a swap."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen))


def make_checkpoint(kind: str, directory: Path, **overrides) -> torch.nn.Module:
    """A small random transformers model saved in ``directory``, with a tokenizer."""
    torch.manual_seed(0)
    if kind == "distilbert":
        cfg = transformers.DistilBertConfig(
            vocab_size=40,
            dim=32,
            n_layers=2,
            n_heads=4,
            hidden_dim=64,
            max_position_embeddings=64,
            **overrides,
        )
        model = transformers.DistilBertModel(cfg)
        _wordpiece_vocab(directory)
    elif kind == "roberta":
        cfg = transformers.RobertaConfig(
            vocab_size=40,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=66,
            pad_token_id=1,
            bos_token_id=0,
            eos_token_id=2,
            type_vocab_size=1,
            layer_norm_eps=1e-5,
            **overrides,
        )
        model = transformers.RobertaModel(cfg)
        _wordlevel_tokenizer(directory)
    else:
        cfg = transformers.BertConfig(
            vocab_size=40,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=64,
            **overrides,
        )
        cls = transformers.BertForMaskedLM if kind == "bert-mlm" else transformers.BertModel
        model = cls(cfg)
        _wordpiece_vocab(directory)
    _perturb(model, seed=len(kind))
    model.eval().save_pretrained(str(directory))
    return model


def _hidden(model, batch) -> torch.Tensor:
    kwargs = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask.long()}
    if "token_type_ids" in model.forward.__code__.co_varnames:
        kwargs["token_type_ids"] = batch.token_type_ids
    with torch.no_grad():
        return model(**kwargs).last_hidden_state


def _assert_same_hidden(encoder: TextEncoder, reference, texts=TEXTS) -> None:
    batch = encoder.tokenize(texts)
    mask = batch.attention_mask
    assert not bool(mask.all())  # something is padded
    with torch.no_grad():
        ours = encoder.model(batch.input_ids, mask, batch.token_type_ids)
    ref = _hidden(reference, batch)
    torch.testing.assert_close(ours[mask], ref[mask], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("kind", "overrides"),
    [
        ("bert", {}),
        ("bert", {"hidden_act": "gelu_new", "layer_norm_eps": 1e-7}),
        ("bert", {"hidden_act": "relu"}),
        ("roberta", {}),
        ("distilbert", {}),
        ("distilbert", {"activation": "relu"}),
    ],
)
def test_random_checkpoint_matches_transformers(tmp_path, kind, overrides):
    reference = make_checkpoint(kind, tmp_path, **overrides)
    encoder = TextEncoder.from_pretrained(tmp_path)
    assert encoder.report.complete
    assert encoder.pooling == "mean" and encoder.normalize is False
    assert encoder.config.norm == "post" and encoder.config.embedding_norm
    _assert_same_hidden(encoder, reference)
    for backend in ("math", "sdpa"):
        _assert_same_hidden(TextEncoder.from_pretrained(tmp_path, backend=backend), reference)


def test_numerics_come_from_the_config(tmp_path):
    make_checkpoint("bert", tmp_path, hidden_act="gelu_new", layer_norm_eps=1e-7)
    cfg = TextEncoder.from_pretrained(tmp_path).config
    assert (cfg.activation, cfg.norm_eps, cfg.type_vocab_size) == ("gelu_tanh", 1e-7, 2)
    roberta = tmp_path / "roberta"
    roberta.mkdir()
    make_checkpoint("roberta", roberta)
    enc = TextEncoder.from_pretrained(roberta)
    assert (enc.config.position_offset, enc.config.pad_token_id) == (2, 1)
    assert enc.max_length == 64  # 66 positions, the first two reserved
    assert enc.tokenize(["the cat", "the"]).input_ids[1, -1] == 1  # padded with <pad>


def test_roberta_long_text_uses_the_last_position(tmp_path):
    reference = make_checkpoint("roberta", tmp_path)
    encoder = TextEncoder.from_pretrained(tmp_path)
    batch = encoder.tokenize(["the " * 200, "cat"])
    assert batch.input_ids.shape[1] == 64 and batch.truncated == [True, False]
    _assert_same_hidden(encoder, reference, ["the " * 200, "cat"])


def test_task_model_checkpoint_reports_its_head(tmp_path):
    reference = make_checkpoint("bert-mlm", tmp_path)
    encoder = TextEncoder.from_pretrained(tmp_path)
    assert encoder.report.unused and all(k.startswith("cls.") for k in encoder.report.unused)
    assert "cls.predictions" in str(encoder.report)
    _assert_same_hidden(encoder, reference.bert)


def test_pytorch_bin_checkpoint_loads(tmp_path):
    reference = make_checkpoint("bert", tmp_path)
    state = dict(reference.state_dict())
    torch.save(state, tmp_path / "pytorch_model.bin")
    (tmp_path / "model.safetensors").unlink()
    encoder = TextEncoder.from_pretrained(tmp_path)
    assert encoder.report.complete
    _assert_same_hidden(encoder, reference)


def test_vocab_txt_only_tokenizer_matches_transformers(tmp_path):
    make_checkpoint("bert", tmp_path)
    ours = TextEncoder.from_pretrained(tmp_path).tokenize(TEXTS)
    ref = transformers.BertTokenizerFast(str(tmp_path / "vocab.txt"))(
        TEXTS, padding=True, truncation=True, max_length=64, return_tensors="pt"
    )
    assert torch.equal(ours.input_ids, ref["input_ids"])


@pytest.mark.parametrize("kind", ["bert", "roberta", "distilbert"])
def test_save_load_round_trip_through_transformers(tmp_path, kind):
    source, saved = tmp_path / "source", tmp_path / "saved"
    source.mkdir()
    make_checkpoint(kind, source)
    encoder = TextEncoder.from_pretrained(source)
    encoder.save_pretrained(saved)
    assert not list(saved.glob(".*.tmp"))  # no temporary file left behind
    reloaded_hf = transformers.AutoModel.from_pretrained(str(saved)).eval()
    _assert_same_hidden(encoder, reloaded_hf)
    again = TextEncoder.from_pretrained(saved)
    assert again.report.complete and again.config == encoder.config
    for name, value in encoder.model.state_dict().items():
        assert torch.equal(value, again.model.state_dict()[name]), name
    config = json.loads((saved / "config.json").read_text())
    assert config["model_type"] == kind


def test_bundled_model_round_trip(tmp_path):
    encoder = TextEncoder.from_pretrained()
    encoder.save_pretrained(tmp_path)
    again = TextEncoder.from_pretrained(tmp_path)
    assert (again.pooling, again.normalize, again.max_length) == ("mean", True, 256)
    texts = ["a sentence to embed", "another one, longer than the first one"]
    np.testing.assert_array_equal(again.encode(texts), encoder.encode(texts))
    hf = transformers.AutoModel.from_pretrained(str(tmp_path)).eval()
    _assert_same_hidden(encoder, hf, texts)
    # the pooler, unused by clearformer, is written back unchanged
    from safetensors.torch import load_file

    from clearformer.interop.hf import bundled_model_dir

    before = load_file(str(bundled_model_dir() / "model.safetensors"))
    after = load_file(str(tmp_path / "model.safetensors"))
    assert torch.equal(before["pooler.dense.weight"], after["pooler.dense.weight"])
    assert set(after) == set(before) - {"embeddings.position_ids"}
