"""``weightedmean`` pooling (sentence-transformers' ``pooling_mode_weightedmean_tokens``): a
mean with weights 1, 2, ..., T by position from the first real token. ``encode`` equals
``SentenceTransformer(dir).encode`` on a ragged batch, with prompts in or out of the pooling,
and the weights are checked against the formula written out (an off-by-one fails both)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from clearformer import TextEncoder
from clearformer.heads import POOLING_MODES, pool

from .helpers import lengths_mask
from .test_pooling_modes import TEXTS, _sentence_dir

os.environ.setdefault("HF_HUB_OFFLINE", "1")
st = pytest.importorskip("sentence_transformers")


def _reference(hidden: torch.Tensor, lengths: list[int], offset: int = 1) -> torch.Tensor:
    """Right-padded rows: weights offset, offset + 1, ... over the first ``lengths[b]`` tokens."""
    rows = []
    for b, n in enumerate(lengths):
        w = torch.arange(offset, offset + n, dtype=hidden.dtype)[:, None]  # (n, 1)
        rows.append((hidden[b, :n] * w).sum(0) / w.sum())
    return torch.stack(rows)


def test_weightedmean_is_a_pooling_mode():
    assert "weightedmean" in POOLING_MODES


def test_weights_are_one_to_t_from_the_first_real_token():
    torch.manual_seed(0)
    hidden = torch.randn(3, 6, 4, dtype=torch.float64)
    lengths = [6, 3, 1]
    got = pool(hidden, lengths_mask(lengths, 6), "weightedmean")
    torch.testing.assert_close(got, _reference(hidden, lengths))
    # An off-by-one (weights 0..T-1 or 2..T+1) is visibly different (rows of several tokens:
    # a lone token is its own weighted mean whatever its weight).
    for wrong in (0, 2):
        assert (got[:2] - _reference(hidden, lengths, offset=wrong)[:2]).abs().max() > 1e-2
    # Left padding: the same rows moved to the right end pool the same.
    left = lengths_mask(lengths, 6).flip(1)
    moved = torch.stack([hidden[b].roll(6 - n, dims=0) for b, n in enumerate(lengths)])
    torch.testing.assert_close(pool(moved, left, "weightedmean"), got)


def test_left_padding_and_a_left_out_prompt_keep_their_weights():
    torch.manual_seed(1)
    hidden = torch.randn(1, 5, 3, dtype=torch.float64)
    left = torch.tensor([[False, False, True, True, True]])
    # Real tokens at 2, 3, 4 weigh 1, 2, 3.
    want = (hidden[0, 2] * 1 + hidden[0, 3] * 2 + hidden[0, 4] * 3) / 6
    torch.testing.assert_close(pool(hidden, left, "weightedmean")[0], want)
    right = torch.tensor([[True, True, True, True, False]])
    # The first two tokens (a prompt) left out: the rest keep weights 3 and 4.
    want = (hidden[0, 2] * 3 + hidden[0, 3] * 4) / 7
    torch.testing.assert_close(pool(hidden, right, "weightedmean", skip=2)[0], want)


def test_an_empty_row_pools_to_zeros_and_half_precision_does_not_overflow():
    hidden = torch.randn(2, 4, 3)
    got = pool(hidden, lengths_mask([4, 0], 4), "weightedmean")
    assert (got[1] == 0).all()
    # 512 tokens: the weights total 131,328, past float16's maximum; float32 sums keep it finite.
    long = torch.ones(1, 512, 8, dtype=torch.float16)
    got = pool(long, torch.ones(1, 512, dtype=torch.bool), "weightedmean")
    assert got.dtype == torch.float16
    torch.testing.assert_close(got, torch.ones(1, 8, dtype=torch.float16))
    assert pool(hidden[:, :0], lengths_mask([0, 0], 0), "weightedmean").shape == (2, 3)


@pytest.mark.parametrize("include_prompt", [True, False])
def test_encode_equals_sentence_transformers(tmp_path, include_prompt):
    path = _sentence_dir(tmp_path, "weightedmean", include_prompt=include_prompt)
    pooling = json.loads((path / "1_Pooling" / "config.json").read_text())
    assert pooling.get("pooling_mode") == "weightedmean"  # the file really asks for it
    ours = TextEncoder.from_pretrained(path)
    assert ours.pooling == "weightedmean"
    reference = st.SentenceTransformer(str(path), device="cpu")
    # TEXTS is ragged (1 to 29 pieces, an empty text): one batch pads most rows.
    np.testing.assert_allclose(ours.encode(TEXTS), reference.encode(TEXTS), atol=1e-5, rtol=0)
    prompt = "query: the dog "
    want = reference.encode(TEXTS, prompt=prompt)
    np.testing.assert_allclose(ours.encode(TEXTS, prompt=prompt), want, atol=1e-5, rtol=0)
    # Negative control: mean pooling of the same states is another vector.
    ours.pooling = "mean"
    assert np.abs(ours.encode(TEXTS) - reference.encode(TEXTS)).max() > 1e-3


def test_the_legacy_boolean_key_selects_weightedmean(tmp_path):
    path = _sentence_dir(tmp_path, "weightedmean")
    config_file = path / "1_Pooling" / "config.json"
    config = json.loads(config_file.read_text())
    del config["pooling_mode"]
    config["pooling_mode_weightedmean_tokens"] = True
    config_file.write_text(json.dumps(config))
    ours = TextEncoder.from_pretrained(path)
    assert ours.pooling == "weightedmean"
    want = st.SentenceTransformer(str(path), device="cpu").encode(TEXTS)
    np.testing.assert_allclose(ours.encode(TEXTS), want, atol=1e-5, rtol=0)


def test_text_encoder_refuses_an_unknown_pooling(tmp_path):
    path = _sentence_dir(tmp_path, "mean")
    ours = TextEncoder.from_pretrained(path)
    with pytest.raises(ValueError, match=r"pooling must be one of .*'weightedmean'.*'weighted'"):
        TextEncoder(ours._loaded, ours.tokenizer, pooling="weighted", normalize=False)
