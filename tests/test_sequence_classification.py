"""Sequence-classification heads against transformers' ``*ForSequenceClassification`` (BERT,
XLM-R, DistilBERT, ModernBERT with either pooling), and the strict loading of their tensors."""

from __future__ import annotations

import json
import os

import pytest
import torch

from clearformer.interop.hf import CheckpointError
from clearformer.interop.hf.heads import load_classifier
from clearformer.interop.hf.weights import read_tensors, write_safetensors

from .helpers import lengths_mask
from .xlmr_helpers import make_xlmr

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

LENGTHS = [17, 5, 12, 1]
T = max(LENGTHS)
SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48)


def _vocab(directory, size):
    words = [f"w{i}" for i in range(size - 5)]
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    (directory / "vocab.txt").write_text("\n".join(specials + words) + "\n")


def _perturb(model, seed=5):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen))


def make_classifier(kind: str, directory, num_labels=3, **overrides):
    """A random transformers ``*ForSequenceClassification`` saved with a tokenizer."""
    torch.manual_seed(0)
    labels = {"num_labels": num_labels}
    if kind == "xlm-roberta":
        return make_xlmr(directory, head="classification", **labels, **overrides)
    if kind == "bert":
        config = transformers.BertConfig(vocab_size=60, max_position_embeddings=64, **SMALL)
        cls = transformers.BertForSequenceClassification
    elif kind == "distilbert":
        config = transformers.DistilBertConfig(
            vocab_size=60, dim=32, n_layers=2, n_heads=4, hidden_dim=48
        )
        cls = transformers.DistilBertForSequenceClassification
    else:
        config = transformers.ModernBertConfig(
            vocab_size=60,
            local_attention=8,
            global_attn_every_n_layers=2,
            max_position_embeddings=64,
            pad_token_id=0,
            cls_token_id=2,
            sep_token_id=3,
            **SMALL,
        )
        cls = transformers.ModernBertForSequenceClassification
    for key, value in {**labels, **overrides}.items():
        setattr(config, key, value)
    model = cls(config)
    _perturb(model)
    model.eval().save_pretrained(str(directory))
    _vocab(directory, 60)
    return model


def _batch(vocab, token_types):
    gen = torch.Generator().manual_seed(1)
    mask = lengths_mask(LENGTHS, T)
    ids = torch.randint(5, vocab, (len(LENGTHS), T), generator=gen).masked_fill(~mask, 0)
    types = (torch.arange(T)[None, :] >= 3).long() * mask if token_types else torch.zeros_like(ids)
    return ids, mask, types


CASES = [
    ("bert", {}),
    ("xlm-roberta", {}),
    ("distilbert", {}),
    ("modernbert", {"classifier_pooling": "cls"}),
    ("modernbert", {"classifier_pooling": "mean"}),
]


@pytest.mark.parametrize(("kind", "overrides"), CASES, ids=[f"{k}-{o}" for k, o in CASES])
def test_logits_equal_transformers(tmp_path, kind, overrides):
    hf = make_classifier(kind, tmp_path, **overrides)
    loaded = load_classifier(tmp_path)
    model, head = loaded.loaded.model, loaded.head
    token_types = model.config.type_vocab_size > 1
    ids, mask, types = _batch(model.config.vocab_size, token_types)
    kwargs = {"token_type_ids": types} if token_types else {}
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask.long(), **kwargs).logits
        got = head(model(ids, mask, types if token_types else None), mask)
    assert got.shape == (len(LENGTHS), 3)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    report = loaded.loaded.report
    assert report.complete
    assert sum(name.startswith("head.") for name in report.loaded) == len(list(head.parameters()))
    # every tensor the head took is reported loaded, not unused
    assert not [k for k in report.unused if k.startswith(("classifier", "head.", "pre_class"))]


def test_modernbert_pooling_is_read_from_the_config(tmp_path):
    """Negative control: the mean-pooled checkpoint read as cls gives other logits."""
    hf = make_classifier("modernbert", tmp_path, classifier_pooling="mean")
    config = json.loads((tmp_path / "config.json").read_text())
    config["classifier_pooling"] = "cls"
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded = load_classifier(tmp_path)
    ids, mask, _ = _batch(60, False)
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask.long()).logits
        got = loaded.head(loaded.loaded.model(ids, mask), mask)
    assert (got - want).abs().max() > 1e-3


def test_labels_come_from_id2label(tmp_path):
    make_classifier("bert", tmp_path, id2label={0: "neg", 1: "neutral", 2: "pos"})
    assert load_classifier(tmp_path).head.config.labels == ("neg", "neutral", "pos")


def test_a_base_model_has_no_head_to_load(tmp_path):
    model = transformers.BertModel(transformers.BertConfig(vocab_size=60, **SMALL))
    model.save_pretrained(str(tmp_path))
    _vocab(tmp_path, 60)
    with pytest.raises(CheckpointError, match="has no sequence-classification head.*BertModel"):
        load_classifier(tmp_path)


def test_a_missing_head_tensor_is_an_error_when_strict(tmp_path):
    make_classifier("bert", tmp_path)
    tensors = read_tensors(tmp_path / "model.safetensors")
    del tensors["classifier.bias"]
    write_safetensors(tensors, tmp_path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"classifier\.bias"):
        load_classifier(tmp_path)
    loose = load_classifier(tmp_path, strict=False)
    assert "classifier.bias" in loose.loaded.report.missing


def test_num_labels_disagreeing_with_the_weights_names_the_tensor(tmp_path):
    make_classifier("xlm-roberta", tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["id2label"] = {"0": "a", "1": "b"}  # the weights have 3 labels
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        CheckpointError, match=r"classifier\.out_proj\.weight.*\(3, 32\).*\(2, 32\)"
    ):
        load_classifier(tmp_path)


def test_unsupported_head_fields_name_the_field(tmp_path):
    make_classifier("modernbert", tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "classifier_pooling": "max"}))
    with pytest.raises(CheckpointError, match="classifier_pooling"):
        load_classifier(tmp_path)
