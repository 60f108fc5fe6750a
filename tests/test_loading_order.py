"""A refusal about the arguments, the tokenizer or the score activation comes before any
weight is read: the weight loader is never called."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

import clearformer.text.cross_encoder as cross_encoder_module
import clearformer.text.encoder_files as encoder_files
from clearformer import CrossEncoder, TextEncoder
from clearformer.interop.hf import CheckpointError

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b", "c"]


def _save(directory: Path, model_class) -> Path:
    torch.manual_seed(0)
    cfg = transformers.BertConfig(
        vocab_size=len(WORDS),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
        num_labels=1,
    )
    model_class(cfg).save_pretrained(str(directory))
    (directory / "vocab.txt").write_text("\n".join(WORDS) + "\n", encoding="utf-8")
    (directory / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    return directory


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory) -> Path:
    return _save(tmp_path_factory.mktemp("bert"), transformers.BertModel)


@pytest.fixture(scope="module")
def cross_dir(tmp_path_factory) -> Path:
    return _save(tmp_path_factory.mktemp("bert-cls"), transformers.BertForSequenceClassification)


@pytest.fixture
def copy(tmp_path):
    def make(source: Path) -> Path:
        target = tmp_path / "ckpt"
        shutil.copytree(source, target)
        return target

    return make


@pytest.fixture
def weight_reads(monkeypatch) -> list[str]:
    """The calls to the encoders' weight loaders (each still loads)."""
    calls: list[str] = []

    def spy(module, name):
        original = getattr(module, name)

        def wrapper(*args, **kwargs):
            calls.append(name)
            return original(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapper)

    spy(encoder_files, "load_model")
    spy(cross_encoder_module, "load_classifier")
    return calls


def _edit(path: Path, **changes) -> None:
    config = json.loads(path.read_text()) if path.is_file() else {}
    config.update(changes)
    path.write_text(json.dumps(config))


def test_the_spies_see_a_load(encoder_dir, cross_dir, weight_reads):
    TextEncoder.from_pretrained(encoder_dir)
    CrossEncoder.from_pretrained(cross_dir)
    assert weight_reads == ["load_model", "load_classifier"]


@pytest.mark.parametrize(
    ("padding_side", "error"), [("middle", ValueError), (1, TypeError), ("Left", ValueError)]
)
def test_bad_padding_side_argument(encoder_dir, weight_reads, padding_side, error):
    with pytest.raises(error, match="padding_side"):
        TextEncoder.from_pretrained(encoder_dir, padding_side=padding_side)
    assert weight_reads == []


def _bad_padding_side_file(directory: Path) -> str:
    _edit(directory / "tokenizer_config.json", padding_side="Left")
    return r"tokenizer_config.json 'padding_side' must be 'right' or 'left', got 'Left'"


def _corrupt_tokenizer(directory: Path) -> str:
    (directory / "vocab.txt").unlink()
    (directory / "tokenizer.json").write_text("{not json")
    return r"cannot read tokenizer .*tokenizer\.json"


def _vocabulary_too_big(directory: Path) -> str:
    with (directory / "vocab.txt").open("a", encoding="utf-8") as handle:
        handle.write("d\ne\n")
    return r"has 10 pieces, more than config.json 'vocab_size'=8"


def _left_padding_without_pad(directory: Path) -> str:
    _edit(directory / "tokenizer_config.json", padding_side="left")
    _edit(directory / "config.json", pad_token_id=None)
    (directory / "vocab.txt").write_text("\n".join(["[UNK]", "[CLS]", "[SEP]", "[MASK]", "a"]))
    return r"left padding needs a pad token"


@pytest.mark.parametrize(
    "fault",
    [_bad_padding_side_file, _corrupt_tokenizer, _vocabulary_too_big, _left_padding_without_pad],
)
def test_text_encoder_tokenizer_refusals(encoder_dir, copy, weight_reads, fault):
    directory = copy(encoder_dir)
    match = fault(directory)
    with pytest.raises(CheckpointError, match=match):
        TextEncoder.from_pretrained(directory)
    assert weight_reads == []


def _bad_activation(directory: Path) -> str:
    _edit(directory / "config_sentence_transformers.json", activation_fn="torch.nn.ReLU")
    return r"'activation_fn'='torch.nn.ReLU' is not supported"


@pytest.mark.parametrize("fault", [_corrupt_tokenizer, _vocabulary_too_big, _bad_activation])
def test_cross_encoder_refusals(cross_dir, copy, weight_reads, fault):
    directory = copy(cross_dir)
    match = fault(directory)
    with pytest.raises(CheckpointError, match=match):
        CrossEncoder.from_pretrained(directory)
    assert weight_reads == []
