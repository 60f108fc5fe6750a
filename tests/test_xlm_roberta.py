"""XLM-RoBERTa checkpoints against transformers: hidden states on every backend, the Unigram
tokenizer's ids, save and reload, and a tokenizer too large for the embedding table."""

from __future__ import annotations

import json
import os

import pytest
import torch

from clearformer import TextEncoder
from clearformer.interop.hf import CheckpointError, family_for

from .xlmr_helpers import make_xlmr

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

TEXTS = [
    "Café déjà vu, naïve résumé",
    "東京は日本の首都です",
    "emoji 🙂 🎉 fun",
    "",
    "unseen letters: Ωψ ß and ☃",
    "hello  world,   spaced\tout",
    "The quick brown fox jumps over the lazy dog. " * 2,
]
PAIRS = [
    ("Café déjà vu", "東京は日本の首都です"),
    ("", "hello"),
    ("emoji 🙂", ""),
    ("the fox", "the dog " * 30),  # truncated: the longest side loses pieces first
]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("xlmr")
    return path, make_xlmr(path)


def _reference(model, batch):
    with torch.no_grad():
        return model(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask.long()
        ).last_hidden_state


def test_family_is_roberta_layout_under_its_own_name(checkpoint):
    path, _ = checkpoint
    hf = json.loads((path / "config.json").read_text())
    family = family_for(hf)
    assert (family.model_type, family.hf_class, family.base_prefix) == (
        "xlm-roberta",
        "XLMRobertaModel",
        "roberta.",
    )
    config = family.encoder_config(hf)
    assert (config.pad_token_id, config.position_offset, config.norm) == (1, 2, "post")


@pytest.mark.parametrize("backend", ["auto", "math", "sdpa", "varlen"])
def test_hidden_states_match_transformers_on_every_backend(checkpoint, backend):
    path, hf = checkpoint
    encoder = TextEncoder.from_pretrained(path, backend=backend)
    batch = encoder.tokenize(TEXTS)  # ragged: lengths from 2 to the longest text
    assert len(set(batch.lengths)) > 3
    with torch.no_grad():
        got = encoder.model(batch.input_ids, batch.attention_mask, batch.token_type_ids)
    want = _reference(hf, batch)
    real = batch.attention_mask
    torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=0)
    assert (got[~real] == 0).all()


def test_ids_equal_transformers_tokenizer(checkpoint):
    path, _ = checkpoint
    reference = transformers.XLMRobertaTokenizerFast.from_pretrained(str(path))
    encoder = TextEncoder.from_pretrained(path)
    assert encoder.max_length == 38  # 40 positions, numbered from pad_token_id + 1 = 2
    batch = encoder.tokenize(TEXTS)
    for row, text in enumerate(TEXTS):
        ids = batch.input_ids[row, : batch.lengths[row]].tolist()
        want = reference(text, truncation=True, max_length=encoder.max_length)["input_ids"]
        assert ids == want, text
    assert 3 in batch.input_ids[TEXTS.index("unseen letters: Ωψ ß and ☃")].tolist()  # <unk>
    assert batch.input_ids[TEXTS.index("")].tolist()[:2] == [0, 2]  # <s> </s>
    # Pairs as a batch, as sentence-transformers' CrossEncoder passes them (a single call with
    # an empty second text would drop the pair: transformers tests ``if text_pair``).
    firsts, seconds = [a for a, _ in PAIRS], [b for _, b in PAIRS]
    want = reference(firsts, seconds, truncation=True, max_length=encoder.max_length)["input_ids"]
    got = [e.ids for e in encoder.tokenizer.tokenizer.encode_batch(PAIRS)]
    assert got == want


def test_save_and_reload_through_transformers(checkpoint, tmp_path):
    path, hf = checkpoint
    encoder = TextEncoder.from_pretrained(path)
    out = encoder.save_pretrained(tmp_path / "saved")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "xlm-roberta" and config["architectures"] == ["XLMRobertaModel"]
    assert (out / "tokenizer.json").is_file()
    again = transformers.AutoModel.from_pretrained(str(out)).eval()
    assert type(again).__name__ == "XLMRobertaModel"
    batch = encoder.tokenize(TEXTS)
    real = batch.attention_mask
    torch.testing.assert_close(
        _reference(again, batch)[real], _reference(hf, batch)[real], atol=1e-6, rtol=0
    )
    reloaded = TextEncoder.from_pretrained(out)
    assert reloaded.encode(TEXTS).tolist() == encoder.encode(TEXTS).tolist()


def test_a_tokenizer_larger_than_vocab_size_names_the_file_and_field(tmp_path):
    make_xlmr(tmp_path, vocab_size=40)  # the tokenizer has more pieces than 40
    with pytest.raises(CheckpointError) as caught:
        TextEncoder.from_pretrained(tmp_path)
    message = str(caught.value)
    assert str(tmp_path / "tokenizer.json") in message
    assert "'vocab_size'=40" in message
