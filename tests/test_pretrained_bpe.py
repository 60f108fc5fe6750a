"""RoBERTa checkpoints that ship a byte-level BPE as ``vocab.json`` + ``merges.txt`` (no
``tokenizer.json``) tokenize as transformers does and give transformers' outputs.

Two references: transformers' ``RobertaTokenizer`` reading the same directory (in transformers
5 the fast tokenizer and ``RobertaTokenizer`` are one class), and a plain-Python copy of the
slow ``RobertaTokenizer`` algorithm of transformers 4 (GPT-2's byte-to-unicode table, regex
pre-split and BPE merges), which shares no code with the ``tokenizers`` library.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
from pathlib import Path

import pytest
import torch

from clearformer import TextEncoder
from clearformer.interop.hf import CheckpointError
from clearformer.interop.hf.files import find_checkpoint

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
regex = pytest.importorskip("regex")

SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # ids 0..4, RoBERTa's order
MAX_POSITIONS = 66  # 64 usable: RoBERTa reserves the first two positions
_TRAINING_TEXT = (
    "the a cat dog sat on mat and ran far away quick brown fox jumps over lazy hello world "
    "café naïve über Ångström crème brûlée 東京 日本語 テキスト 机器 学习 😀 🚀 👍🏽 "
    "don't it's we're I'll 2024 3.14 % ? ! , ."
)
_TRAINING_WORDS = _TRAINING_TEXT.split()
TEXTS = [
    "the cat sat on the mat",
    " leading space",
    "   several leading spaces and  double  spaces ",
    "",
    "café naïve über Ångström",
    "cafe\u0301 with a combining accent",
    "東京 日本語のテキスト 机器学习",
    "emoji 😀🚀 👍🏽 👨‍👩‍👧 🇫🇷",
    "don't stop, it's 2024! we're 3.14 % done?",
    "line one\nline two\ttab",
    "unseenword zyxwvut qqq",
    "the <mask> sat on <s> mat </s>",
    "<mask>",
    "x<mask>y",
]


@pytest.fixture(scope="module")
def bpe_files(tmp_path_factory) -> Path:
    """vocab.json + merges.txt of a tiny byte-level BPE trained on generated sentences."""
    from tokenizers import ByteLevelBPETokenizer

    rng = random.Random(0)
    sentences = [
        " ".join(rng.choice(_TRAINING_WORDS) for _ in range(rng.randint(1, 12))) for _ in range(400)
    ]
    trainer = ByteLevelBPETokenizer()
    trainer.train_from_iterator(
        sentences, vocab_size=400, min_frequency=2, special_tokens=SPECIALS, show_progress=False
    )
    directory = tmp_path_factory.mktemp("bpe")
    trainer.save_model(str(directory))
    vocab = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
    assert [vocab[t] for t in SPECIALS] == [0, 1, 2, 3, 4]
    assert len(vocab) > 256 + len(SPECIALS)  # every byte, the specials, and some merges
    return directory


def _v4_tokenizer_config(**changes) -> dict:
    """tokenizer_config.json as transformers 4 writes it for RobertaTokenizer."""
    config = {
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(i): {
                "content": t,
                "lstrip": t == "<mask>",
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for i, t in enumerate(SPECIALS)
        },
        "bos_token": "<s>",
        "cls_token": "<s>",
        "eos_token": "</s>",
        "mask_token": "<mask>",
        "model_max_length": 512,
        "pad_token": "<pad>",
        "sep_token": "</s>",
        "tokenizer_class": "RobertaTokenizer",
        "trim_offsets": True,
        "unk_token": "<unk>",
    }
    config.update(changes)
    return config


def make_bpe_checkpoint(directory: Path, bpe_files: Path, tokenizer_config: dict | None):
    """A small random RobertaModel saved by transformers, with only vocab.json + merges.txt
    for a tokenizer (and tokenizer_config.json when given)."""
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(bpe_files / name, directory / name)
    vocab_size = len(json.loads((directory / "vocab.json").read_text(encoding="utf-8")))
    torch.manual_seed(0)
    cfg = transformers.RobertaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=MAX_POSITIONS,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        type_vocab_size=1,
        layer_norm_eps=1e-5,
    )
    model = transformers.RobertaModel(cfg)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # off the initial values, so LayerNorm ones/zeros cannot hide a swap
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen))
    model.eval().save_pretrained(str(directory))
    if tokenizer_config is not None:
        (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    (directory / "tokenizer.json").unlink(missing_ok=True)
    return model


@pytest.fixture
def checkpoint(tmp_path, bpe_files) -> Path:
    make_bpe_checkpoint(tmp_path, bpe_files, _v4_tokenizer_config())
    return tmp_path


# --- transformers 4's slow RobertaTokenizer, in plain Python --------------------------------

_GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    table, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


class SlowRoberta:
    """The slow RobertaTokenizer of transformers 4: split out the special tokens (``<mask>``
    swallows the whitespace before it), then regex pre-split, byte-map and BPE each chunk."""

    def __init__(self, directory: Path, add_prefix_space: bool = False) -> None:
        self.vocab = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
        lines = (directory / "merges.txt").read_text(encoding="utf-8").split("\n")
        pairs = [tuple(line.split()) for line in lines[1:] if line.strip()]
        self.ranks = {pair: rank for rank, pair in enumerate(pairs)}
        self.add_prefix_space = add_prefix_space
        self.byte_map = _bytes_to_unicode()
        self.split = regex.compile(_GPT2_SPLIT)
        specials = "|".join(regex.escape(t) for t in sorted(SPECIALS, key=len, reverse=True))
        self.specials = regex.compile(f"({specials})")

    def _bpe(self, piece: str) -> list[str]:
        word = list(piece)
        while len(word) > 1:
            best = min(zip(word, word[1:], strict=False), key=lambda p: self.ranks.get(p, math.inf))
            if best not in self.ranks:
                break
            merged, i = [], 0
            while i < len(word):
                if i < len(word) - 1 and (word[i], word[i + 1]) == best:
                    merged.append(word[i] + word[i + 1])
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = merged
        return word

    def ids(self, text: str, pair: str | None = None) -> list[int]:
        def body(text: str) -> list[int]:
            if self.add_prefix_space and text and not text[0].isspace():
                text = " " + text
            chunks = self.specials.split(text)
            for i, chunk in enumerate(chunks):
                if chunk == "<mask>" and i > 0:
                    chunks[i - 1] = chunks[i - 1].rstrip()
            out = []
            for i, chunk in enumerate(chunks):
                if i % 2:  # a special token
                    out.append(self.vocab[chunk])
                    continue
                for piece in self.split.findall(chunk):
                    mapped = "".join(self.byte_map[b] for b in piece.encode("utf-8"))
                    out += [self.vocab.get(p, self.vocab["<unk>"]) for p in self._bpe(mapped)]
            return out

        ids = [0, *body(text), 2]
        return ids if pair is None else [*ids, 2, *body(pair), 2]


# --- helpers -----------------------------------------------------------------------------


def _rows(batch) -> list[list[int]]:
    """Each row's real token ids (padding dropped)."""
    return [
        ids[mask].tolist() for ids, mask in zip(batch.input_ids, batch.attention_mask, strict=True)
    ]


def _transformers_ids(directory: Path, texts: list[str], **kwargs) -> list[list[int]]:
    reference = transformers.RobertaTokenizer.from_pretrained(str(directory), **kwargs)
    return reference(texts, truncation=True, max_length=MAX_POSITIONS - 2)["input_ids"]


# --- tests -------------------------------------------------------------------------------


def test_vocab_json_and_merges_are_found_together(checkpoint):
    files = find_checkpoint(checkpoint)
    assert (files.tokenizer.name, files.merges.name) == ("vocab.json", "merges.txt")


def test_ids_match_transformers_and_the_slow_tokenizer(checkpoint):
    ours = _rows(TextEncoder.from_pretrained(checkpoint).tokenize(TEXTS))
    assert ours == _transformers_ids(checkpoint, TEXTS)
    slow = SlowRoberta(checkpoint)
    for text, ids in zip(TEXTS, ours, strict=True):
        assert ids == slow.ids(text), text


def test_add_prefix_space_comes_from_the_tokenizer_config(tmp_path, bpe_files):
    make_bpe_checkpoint(tmp_path, bpe_files, _v4_tokenizer_config(add_prefix_space=True))
    texts = [t for t in TEXTS if "<" not in t]  # specials mid-text: transformers' own two differ
    ours = _rows(TextEncoder.from_pretrained(tmp_path).tokenize(texts))
    assert ours == _transformers_ids(tmp_path, texts)
    slow = SlowRoberta(tmp_path, add_prefix_space=True)
    assert ours == [slow.ids(t) for t in texts]
    assert ours[0][1] == json.loads((tmp_path / "vocab.json").read_text())["Ġthe"]


@pytest.mark.parametrize("config_prefix_space", [True, False])
def test_tokenizer_json_follows_the_configs_add_prefix_space(
    tmp_path, bpe_files, config_prefix_space
):
    """tokenizer.json written with the other add_prefix_space: transformers (and so
    sentence-transformers) rebuilds the pre-tokenizer and the post-processor from the config."""
    make_bpe_checkpoint(
        tmp_path, bpe_files, _v4_tokenizer_config(add_prefix_space=config_prefix_space)
    )
    written = transformers.RobertaTokenizer.from_pretrained(
        str(tmp_path), add_prefix_space=not config_prefix_space
    )
    written.backend_tokenizer.save(str(tmp_path / "tokenizer.json"))
    texts = [t for t in TEXTS if "<" not in t]
    expected = transformers.AutoTokenizer.from_pretrained(str(tmp_path))(texts)["input_ids"]
    assert _rows(TextEncoder.from_pretrained(tmp_path).tokenize(texts)) == expected
    assert expected == [SlowRoberta(tmp_path, config_prefix_space).ids(t) for t in texts]


def test_without_tokenizer_config_the_slow_defaults_apply(tmp_path, bpe_files):
    """No tokenizer_config.json: RobertaTokenizer's defaults, ``<mask>`` stripping left."""
    from tokenizers import AddedToken

    make_bpe_checkpoint(tmp_path, bpe_files, None)
    ours = _rows(TextEncoder.from_pretrained(tmp_path).tokenize(TEXTS))
    slow = SlowRoberta(tmp_path)
    assert ours == [slow.ids(t) for t in TEXTS]
    mask = AddedToken("<mask>", lstrip=True, rstrip=False, normalized=False, special=True)
    assert ours == _transformers_ids(tmp_path, TEXTS, mask_token=mask)


def test_special_tokens_are_never_split(checkpoint):
    batch = TextEncoder.from_pretrained(checkpoint).tokenize(["the <mask> sat on <s> mat </s>"])
    ids = _rows(batch)[0]
    assert ids[:3] == [0, SlowRoberta(checkpoint).vocab["the"], 4]  # <mask> took its space
    assert ids.count(0) == 2 and ids[-2:] == [2, 2]  # the text's <s> and </s>, then the closing
    assert [t.strip() for t in batch.tokens[0]].count("<mask>") == 1


def test_pairs_use_the_roberta_template(checkpoint):
    ours = TextEncoder.from_pretrained(checkpoint).tokenizer.tokenizer
    reference = transformers.RobertaTokenizer.from_pretrained(str(checkpoint))
    slow = SlowRoberta(checkpoint)
    # not an empty second text: transformers then drops the pair and encodes a single text
    for a, b in [("hello world", "the cat"), ("", "café"), ("東京", "emoji 😀")]:
        expected = reference(a, b)["input_ids"]
        assert ours.encode(a, b).ids == expected == slow.ids(a, b)
        assert expected[:1] == [0] and expected.count(2) == 3  # <s> A </s></s> B </s>


def test_long_text_is_truncated_with_the_closing_token(checkpoint):
    text = "the quick brown fox " * 40
    batch = TextEncoder.from_pretrained(checkpoint).tokenize([text, "cat"])
    assert batch.input_ids.shape[1] == MAX_POSITIONS - 2 and batch.truncated == [True, False]
    assert _rows(batch) == _transformers_ids(checkpoint, [text, "cat"])
    assert batch.input_ids[0, -1] == 2 and batch.input_ids[1, -1] == 1  # </s>; <pad>


@pytest.mark.parametrize("backend", ["auto", "math", "sdpa"])
def test_model_outputs_match_transformers(tmp_path, bpe_files, backend):
    make_bpe_checkpoint(tmp_path, bpe_files, _v4_tokenizer_config())
    reference = transformers.AutoModel.from_pretrained(str(tmp_path)).eval()
    encoder = TextEncoder.from_pretrained(tmp_path, backend=backend)
    assert encoder.report.complete
    batch = encoder.tokenize(TEXTS)
    mask = batch.attention_mask
    assert not bool(mask.all())  # something is padded
    with torch.no_grad():
        ours = encoder.model(batch.input_ids, mask, batch.token_type_ids)
        ref = reference(input_ids=batch.input_ids, attention_mask=mask.long()).last_hidden_state
    torch.testing.assert_close(ours[mask], ref[mask], atol=1e-5, rtol=1e-5)


def test_save_pretrained_keeps_the_bpe_files(checkpoint, tmp_path_factory):
    saved = tmp_path_factory.mktemp("saved")
    encoder = TextEncoder.from_pretrained(checkpoint)
    encoder.save_pretrained(saved)
    assert find_checkpoint(saved).merges == saved / "merges.txt"
    assert _rows(TextEncoder.from_pretrained(saved).tokenize(TEXTS)) == _rows(
        encoder.tokenize(TEXTS)
    )


# --- errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("remove", "kept"), [("merges.txt", "vocab.json"), ("vocab.json", "merges.txt")]
)
def test_half_a_bpe_tokenizer_names_the_missing_file(checkpoint, remove, kept):
    (checkpoint / remove).unlink()
    with pytest.raises(CheckpointError, match=rf"incomplete: .*{remove} is missing") as info:
        find_checkpoint(checkpoint)
    assert kept in str(info.value)


def test_half_a_bpe_tokenizer_is_an_error_even_beside_vocab_txt(checkpoint):
    (checkpoint / "merges.txt").unlink()
    (checkpoint / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n", encoding="utf-8")
    with pytest.raises(CheckpointError, match="merges.txt is missing"):
        find_checkpoint(checkpoint)


def test_tokenizer_json_wins_over_vocab_json(checkpoint):
    """With tokenizer.json present, a lone vocab.json is no error (merges.txt is not needed)."""
    before = _rows(TextEncoder.from_pretrained(checkpoint).tokenize(TEXTS))
    reference = transformers.RobertaTokenizer.from_pretrained(str(checkpoint))
    reference.backend_tokenizer.save(str(checkpoint / "tokenizer.json"))
    (checkpoint / "merges.txt").unlink()
    files = find_checkpoint(checkpoint)
    assert (files.tokenizer.name, files.merges) == ("tokenizer.json", None)
    assert _rows(TextEncoder.from_pretrained(checkpoint).tokenize(TEXTS)) == before


def test_corrupt_vocab_json(checkpoint):
    (checkpoint / "vocab.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(CheckpointError, match=r"cannot read BPE tokenizer .*vocab\.json"):
        TextEncoder.from_pretrained(checkpoint)


def test_sequence_tokens_missing_from_the_vocabulary(tmp_path, bpe_files):
    make_bpe_checkpoint(tmp_path, bpe_files, _v4_tokenizer_config(cls_token="<cls>"))
    with pytest.raises(CheckpointError, match=r"lacks the special tokens cls_token='<cls>'"):
        TextEncoder.from_pretrained(tmp_path)


def test_added_token_ids_must_agree_with_the_vocabulary(tmp_path, bpe_files):
    config = _v4_tokenizer_config()
    config["added_tokens_decoder"]["7"] = config["added_tokens_decoder"].pop("4")
    make_bpe_checkpoint(tmp_path, bpe_files, config)
    with pytest.raises(
        CheckpointError, match=r"'<mask>' id 7, but with .*vocab\.json it gets id 4"
    ):
        TextEncoder.from_pretrained(tmp_path)
