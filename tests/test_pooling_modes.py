"""sentence-transformers' pooling modes on clearformer: ``SentenceTransformer(dir).encode``
parity for every mode clearformer runs, prompts included or left out of the pooling, on
small random directories saved by sentence-transformers itself."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from clearformer import TextEncoder
from clearformer.heads import pool

from .helpers import lengths_mask
from .test_pretrained_checkpoints import make_checkpoint

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("transformers")
st = pytest.importorskip("sentence_transformers")

TEXTS = ["the cat sat on the mat", "hello", "", "quick brown fox jumps over the lazy dog " * 3]
MODES = ["mean", "cls", "max", "mean_sqrt_len_tokens", "lasttoken"]


def _sentence_dir(tmp_path, mode, include_prompt=True):
    """A random BERT with a Pooling module, saved by sentence-transformers."""
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    base = tmp_path / "base"
    base.mkdir()
    make_checkpoint("bert", base)
    transformer = Transformer(str(base))
    pooling = Pooling(32, pooling_mode=mode, include_prompt=include_prompt)
    out = tmp_path / "sentence"
    st.SentenceTransformer(modules=[transformer, pooling], device="cpu").save(str(out))
    return out


@pytest.mark.parametrize("mode", MODES)
def test_encode_equals_sentence_transformers(tmp_path, mode):
    path = _sentence_dir(tmp_path, mode)
    pooling = json.loads((path / "1_Pooling" / "config.json").read_text())
    assert pooling.get("pooling_mode", mode) == mode  # the file really asks for this mode
    ours = TextEncoder.from_pretrained(path)
    assert ours.pooling == mode
    want = st.SentenceTransformer(str(path), device="cpu").encode(TEXTS)
    np.testing.assert_allclose(ours.encode(TEXTS), want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("mode", ["mean", "cls", "lasttoken"])
@pytest.mark.parametrize("include_prompt", [True, False])
def test_prompts_in_or_out_of_the_pooling(tmp_path, mode, include_prompt):
    path = _sentence_dir(tmp_path, mode, include_prompt=include_prompt)
    ours = TextEncoder.from_pretrained(path)
    assert ours.include_prompt is include_prompt
    reference = st.SentenceTransformer(str(path), device="cpu")
    prompt = "query: the dog "
    want = reference.encode(TEXTS, prompt=prompt)
    got = ours.encode(TEXTS, prompt=prompt)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    if not include_prompt and mode != "lasttoken":
        # Negative control: the prompt's tokens counted in would give other vectors.
        assert np.abs(ours.encode([prompt + t for t in TEXTS]) - got).max() > 1e-4


def test_lasttoken_takes_the_last_real_token_on_either_side():
    hidden = torch.randn(3, 5, 4)
    right = lengths_mask([5, 2, 0], 5)
    got = pool(hidden, right, "lasttoken")
    torch.testing.assert_close(got[0], hidden[0, 4])
    torch.testing.assert_close(got[1], hidden[1, 1])
    assert (got[2] == 0).all()  # no real token
    left = right.flip(1)  # left padding: the last token is at the end
    torch.testing.assert_close(pool(hidden, left, "lasttoken")[1], hidden[1, 4])


@pytest.mark.parametrize("mode", MODES + ["weightedmean"])
@pytest.mark.parametrize("skip", [0, 2])
def test_every_mode_pools_a_left_padded_row_as_the_right_padded_one(mode, skip):
    """The padding side changes nothing: cls is the first real token and a prompt left out is
    the first `skip` real tokens, on either side (sentence-transformers' rules)."""
    hidden = torch.randn(3, 6, 4)
    right = lengths_mask([6, 4, 3], 6)
    left = right.flip(1)
    shifted = torch.stack([hidden[b].roll(int((~right[b]).sum()), 0) for b in range(3)])
    want = pool(hidden, right, mode, skip=skip)
    torch.testing.assert_close(pool(shifted, left, mode, skip=skip), want)
    if mode == "cls":
        torch.testing.assert_close(want[1], hidden[1, skip])  # the first token after the prompt


def test_max_over_no_position_is_minus_infinity_whatever_the_batch():
    got = pool(torch.randn(2, 0, 3), torch.zeros(2, 0, dtype=torch.bool), "max")
    assert got.shape == (2, 3) and bool((got == float("-inf")).all())


@pytest.mark.parametrize("prompt_name", [None, "document"])
def test_an_empty_prompt_leaves_nothing_out_of_the_pooling(tmp_path, prompt_name):
    """sentence-transformers 6 saves empty "query" and "document" prompts: an empty prompt is
    no prompt, and a pooling without the prompt keeps the opening token."""
    path = _sentence_dir(tmp_path, "mean", include_prompt=False)
    config_file = path / "config_sentence_transformers.json"
    config = json.loads(config_file.read_text())
    config["prompts"] = {"query": "", "document": ""}
    config_file.write_text(json.dumps(config))
    ours = TextEncoder.from_pretrained(path)
    reference = st.SentenceTransformer(str(path), device="cpu")
    kwargs = {"prompt_name": prompt_name} if prompt_name else {"prompt": ""}
    assert ours.resolve_prompt(**kwargs) == (None, 0)
    np.testing.assert_allclose(
        ours.encode(TEXTS, **kwargs), reference.encode(TEXTS, **kwargs), atol=1e-5, rtol=0
    )


def test_do_lower_case_lowercases_before_a_cased_tokenizer(tmp_path):
    """sentence_bert_config.json's do_lower_case: sentence-transformers lowercases the texts
    whatever the tokenizer's own casing."""
    path = _sentence_dir(tmp_path, "mean")
    tokenizer_file = path / "tokenizer.json"
    tokenizer = json.loads(tokenizer_file.read_text())
    tokenizer["normalizer"]["lowercase"] = False  # a cased tokenizer
    tokenizer_file.write_text(json.dumps(tokenizer))
    # transformers rebuilds a BERT tokenizer's normalizer from tokenizer_config.json, whose
    # do_lower_case is true when absent: cased there too.
    config_path = path / "tokenizer_config.json"
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    config_path.write_text(json.dumps({**config, "do_lower_case": False}))
    texts = ["The CAT sat", "HELLO there"]
    cased = TextEncoder.from_pretrained(path).encode(texts)
    config_file = path / "sentence_bert_config.json"
    config_file.write_text(
        json.dumps({**json.loads(config_file.read_text()), "do_lower_case": True})
    )
    ours = TextEncoder.from_pretrained(path).encode(texts)
    want = st.SentenceTransformer(str(path), device="cpu").encode(texts)
    np.testing.assert_allclose(ours, want, atol=1e-5, rtol=0)
    assert np.abs(ours - cased).max() > 1e-3  # negative control: the casing mattered


def test_mean_sqrt_len_is_the_sum_over_the_root_of_the_count():
    hidden = torch.randn(2, 6, 3)
    mask = lengths_mask([6, 4], 6)
    got = pool(hidden, mask, "mean_sqrt_len_tokens")
    torch.testing.assert_close(got[1], hidden[1, :4].sum(0) / 2.0)
    torch.testing.assert_close(got[0], hidden[0].sum(0) / 6**0.5)


def test_include_prompt_must_be_a_bool(tmp_path):
    from clearformer.interop.hf import CheckpointError

    path = _sentence_dir(tmp_path, "mean")
    config_file = path / "1_Pooling" / "config.json"
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**config, "include_prompt": "no"}))
    with pytest.raises(CheckpointError, match="include_prompt"):
        TextEncoder.from_pretrained(path)


def _prompted_dir(tmp_path, default=None):
    """A sentence-transformers directory whose config names prompts (and a default)."""
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    base = tmp_path / "base"
    base.mkdir()
    make_checkpoint("bert", base)
    model = st.SentenceTransformer(
        modules=[Transformer(str(base)), Pooling(32, pooling_mode="mean")],
        device="cpu",
        prompts={"query": "query: the dog ", "passage": "passage: "},
        default_prompt_name=default,
    )
    out = tmp_path / "prompted"
    model.save(str(out))
    return out


@pytest.mark.parametrize("default", [None, "query"])
def test_named_and_default_prompts_equal_sentence_transformers(tmp_path, default):
    path = _prompted_dir(tmp_path, default)
    ours = TextEncoder.from_pretrained(path)
    reference = st.SentenceTransformer(str(path), device="cpu")
    assert (
        ours.prompts.prompts == reference.prompts
    )  # the file's, as sentence-transformers reads it
    assert {
        "query": "query: the dog ",
        "passage": "passage: ",
    }.items() <= ours.prompts.prompts.items()
    assert ours.prompts.default == default == reference.default_prompt_name
    for kwargs in ({}, {"prompt_name": "passage"}, {"prompt": "custom "}):
        want = reference.encode(TEXTS, **kwargs)
        np.testing.assert_allclose(ours.encode(TEXTS, **kwargs), want, atol=1e-5, rtol=0)
    if default is not None:  # the default really is applied: no prompt gives other vectors
        plain = ours.encode(TEXTS, prompt="")
        assert np.abs(plain - ours.encode(TEXTS)).max() > 1e-4
    with pytest.raises(ValueError, match=r"prompt_name must be one of .*'passage'.*'query'"):
        ours.encode(TEXTS, prompt_name="title")


def test_a_default_prompt_name_that_names_no_prompt_is_refused(tmp_path):
    from clearformer.interop.hf import CheckpointError

    path = _prompted_dir(tmp_path)
    config = json.loads((path / "config_sentence_transformers.json").read_text())
    config["default_prompt_name"] = "title"
    (path / "config_sentence_transformers.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="'default_prompt_name' must be one of"):
        TextEncoder.from_pretrained(path)
