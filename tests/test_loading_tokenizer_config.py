"""tokenizer_config.json's casing, accent and prefix-space fields over a ``tokenizer.json``
that disagrees with them: the ids are transformers' ``AutoTokenizer``'s (which
sentence-transformers uses), for the tokenizer classes that rebuild those steps from the config.

Everything is built in temporary directories from random weights: no download.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from clearformer import TextEncoder
from clearformer.interop.hf import bundled_model_dir

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

TEXTS = [
    "Hello World",
    "HELLO café hé",
    "Crème brûlée naïve Cafe",
    "東京 the Cat",
    "hello world",
]
_WORDPIECES = [
    "[PAD]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    "[MASK]",
    *("the", "cat", "Cat", "hello", "Hello", "HELLO", "world", "World", "he", "hé", "h"),
    *("caf", "café", "Cafe", "cafe", "##e", "##é", "##s", "cr", "##eme", "##ème", "Cr"),
    *("br", "##ul", "##ée", "##ee", "##û", "##u", "##lee", "na", "##ive", "##ïve", "東", "京"),
]


def _rows(batch) -> list[list[int]]:
    return [
        ids[mask].tolist() for ids, mask in zip(batch.input_ids, batch.attention_mask, strict=True)
    ]


def _reference_ids(directory: Path, texts: list[str]) -> list[list[int]]:
    reference = transformers.AutoTokenizer.from_pretrained(str(directory))
    return reference(texts)["input_ids"]


@pytest.fixture(scope="module")
def bert_weights(tmp_path_factory) -> Path:
    """config.json and model.safetensors of a small random BERT (its vocabulary: _WORDPIECES)."""
    directory = tmp_path_factory.mktemp("bert-weights")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(
        vocab_size=len(_WORDPIECES),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
    )
    transformers.BertModel(cfg).save_pretrained(str(directory))
    return directory


def _wordpiece_checkpoint(
    directory: Path, weights: Path, normalizer: dict, tokenizer_config: dict
) -> Path:
    """``weights`` with a WordPiece tokenizer.json whose BertNormalizer takes ``normalizer``'s
    settings, and ``tokenizer_config`` as tokenizer_config.json."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    for name in ("config.json", "model.safetensors"):
        shutil.copy(weights / name, directory / name)
    vocab = {piece: i for i, piece in enumerate(_WORDPIECES)}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, **normalizer)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.add_special_tokens(_WORDPIECES[:5])
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)],
    )
    tok.save(str(directory / "tokenizer.json"))
    specials = dict(
        zip(
            ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token"),
            _WORDPIECES[:5],
            strict=True,
        )
    )
    config = {**specials, "model_max_length": 64, **tokenizer_config}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


_BERT_CASES = {
    # tokenizer.json lowercases, the config says cased
    "config-cased": (
        {"lowercase": True, "strip_accents": None},
        {"do_lower_case": False},
    ),
    # tokenizer.json is cased, the config has no do_lower_case (the class's default: lowercase)
    "config-default-lowercase": (
        {"lowercase": False, "strip_accents": None},
        {},
    ),
    # tokenizer.json strips accents (as lowercasing implies), the config keeps them
    "config-keeps-accents": (
        {"lowercase": True, "strip_accents": None},
        {"do_lower_case": True, "strip_accents": False},
    ),
    # tokenizer.json keeps accents and case, the config strips accents without lowercasing
    "config-strips-accents": (
        {"lowercase": False, "strip_accents": False},
        {"do_lower_case": False, "strip_accents": True},
    ),
    # Chinese characters are not split apart by the config's tokenizer
    "config-no-chinese-split": (
        {"lowercase": True, "strip_accents": None, "handle_chinese_chars": True},
        {"do_lower_case": True, "tokenize_chinese_chars": False},
    ),
}


@pytest.mark.parametrize(
    "tokenizer_class",
    ["BertTokenizer", "BertTokenizerFast", "DistilBertTokenizer", "MPNetTokenizer"],
)
@pytest.mark.parametrize("case", sorted(_BERT_CASES))
def test_bert_classes_follow_the_config(tmp_path, bert_weights, tokenizer_class, case):
    normalizer, fields = _BERT_CASES[case]
    directory = _wordpiece_checkpoint(
        tmp_path, bert_weights, normalizer, {"tokenizer_class": tokenizer_class, **fields}
    )
    expected = _reference_ids(directory, TEXTS)
    assert _rows(TextEncoder.from_pretrained(directory).tokenize(TEXTS)) == expected
    # the two files disagree, so tokenizer.json alone would give other ids
    as_written = tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json"))
    assert [e.ids for e in as_written.encode_batch(TEXTS)] != expected


def test_other_classes_keep_tokenizer_json(tmp_path, bert_weights):
    directory = _wordpiece_checkpoint(
        tmp_path,
        bert_weights,
        {"lowercase": True, "strip_accents": None},
        {"tokenizer_class": "PreTrainedTokenizerFast", "do_lower_case": False},
    )
    as_written = tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json"))
    expected = [e.ids for e in as_written.encode_batch(TEXTS)]
    assert _rows(TextEncoder.from_pretrained(directory).tokenize(TEXTS)) == expected
    assert _reference_ids(directory, TEXTS) == expected


def test_bundled_model_tokenizes_as_its_tokenizer_json():
    texts = [*TEXTS, "Ångström 机器学习 😍", "  Mixed   CASE\ttext\n"]
    tokenizer_json = bundled_model_dir() / "tokenizer.json"
    as_written = tokenizers.Tokenizer.from_file(str(tokenizer_json))
    as_written.no_padding()  # it pads to a fixed length; the encoder pads batches itself
    expected = [e.ids for e in as_written.encode_batch(texts)]
    assert _rows(TextEncoder.from_pretrained().tokenize(texts)) == expected
    assert _reference_ids(bundled_model_dir(), texts) == expected


# --- XLM-RoBERTa: a SentencePiece-style Unigram with a Metaspace pre-tokenizer ----------------

_XLMR_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
_XLMR_PIECES = [
    ("\u2581hello", -2.0),
    ("hello", -2.5),
    ("\u2581world", -2.0),
    ("world", -2.5),
    ("\u2581", -3.0),
    *((c, -5.0) for c in "helowrdcat"),
]


def _xlmr_checkpoint(directory: Path, scheme: str, tokenizer_config: dict) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = [(t, 0.0) for t in _XLMR_SPECIALS] + list(_XLMR_PIECES)
    tok = Tokenizer(models.Unigram(vocab, unk_id=3))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme=scheme)
    tok.add_special_tokens(_XLMR_SPECIALS)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)],
    )
    tok.save(str(directory / "tokenizer.json"))
    specials = dict(
        zip(
            ("bos_token", "pad_token", "eos_token", "unk_token", "mask_token"),
            _XLMR_SPECIALS,
            strict=True,
        )
    )
    config = {
        **specials,
        "cls_token": "<s>",
        "sep_token": "</s>",
        "model_max_length": 64,
        "tokenizer_class": "XLMRobertaTokenizer",
        **tokenizer_config,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    torch.manual_seed(0)
    cfg = transformers.XLMRobertaConfig(
        vocab_size=len(vocab),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=66,
        pad_token_id=1,
    )
    transformers.XLMRobertaModel(cfg).save_pretrained(str(directory))
    return directory


@pytest.mark.parametrize(
    ("scheme", "fields"),
    [("always", {"add_prefix_space": False}), ("never", {})],
    ids=["config-no-prefix-space", "config-default-prefix-space"],
)
def test_xlm_roberta_follows_add_prefix_space(tmp_path, scheme, fields):
    directory = _xlmr_checkpoint(tmp_path, scheme, fields)
    texts = ["hello world", "world hello cat", "hello"]
    expected = _reference_ids(directory, texts)
    assert _rows(TextEncoder.from_pretrained(directory).tokenize(texts)) == expected
    as_written = tokenizers.Tokenizer.from_file(str(directory / "tokenizer.json"))
    assert [e.ids for e in as_written.encode_batch(texts)] != expected


# --- vocab.txt only: special tokens written as serialized AddedTokens --------------------------


def test_vocab_txt_reads_added_token_dicts(tmp_path, bert_weights):
    for name in ("config.json", "model.safetensors"):
        shutil.copy(bert_weights / name, tmp_path / name)
    (tmp_path / "vocab.txt").write_text("\n".join(_WORDPIECES) + "\n", encoding="utf-8")
    keys = ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token")
    config = {"tokenizer_class": "BertTokenizer", "do_lower_case": True}
    for key, text in zip(keys, _WORDPIECES[:5], strict=True):
        config[key] = {
            "__type": "AddedToken",
            "content": text,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
        }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    texts = ["Hello World qqq", "the cat", "[MASK] hello [PAD]"]
    expected = _reference_ids(tmp_path, texts)
    encoder = TextEncoder.from_pretrained(tmp_path)
    assert _rows(encoder.tokenize(texts)) == expected
    assert encoder.tokenizer.pad_id == 0 and expected[1] == [2, 5, 6, 3]
