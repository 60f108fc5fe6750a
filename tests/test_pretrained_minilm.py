"""The bundled all-MiniLM-L6-v2 on clearformer against transformers and sentence-transformers."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from clearformer import TextEncoder
from clearformer.interop.hf import bundled_model_dir

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

LONG = " ".join(["the quick brown fox jumps over the lazy dog"] * 40)  # ~360 pieces
TEXTS = [
    "A man is eating food.",
    "",
    "   \t  ",
    LONG,
    "Crème brûlée, naïve café, Ångström.",
    "机器学习是人工智能的一个分支。",
    "日本語のテキストも埋め込めます",
    "I love it 😍🔥👍🏽",
    "def add(a, b):\n    return a + b  # sum",
    "SELECT name FROM users WHERE id = 42;",
    "short",
    "The weather today is sunny with a light breeze from the west, perfect for a walk.",
]


@pytest.fixture(scope="module")
def encoder() -> TextEncoder:
    return TextEncoder.from_pretrained()


@pytest.fixture(scope="module")
def hf_model():
    model = transformers.AutoModel.from_pretrained(str(bundled_model_dir()))
    return model.eval()


@pytest.fixture(scope="module")
def st_model():
    st = pytest.importorskip("sentence_transformers")
    return st.SentenceTransformer(str(bundled_model_dir()), device="cpu")


def test_attributes(encoder):
    assert encoder.pooling == "mean"
    assert encoder.normalize is True
    assert encoder.max_length == 256
    assert not encoder.model.training
    assert encoder.config.norm == "post" and encoder.config.norm_eps == 1e-12
    assert encoder.config.activation == "gelu"
    assert encoder.path == bundled_model_dir()
    assert encoder.report.complete
    assert encoder.report.unused == ["pooler.dense.bias", "pooler.dense.weight"]


def test_tokenize_matches_transformers_tokenizer(encoder):
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(bundled_model_dir()))
    batch = encoder.tokenize(TEXTS)
    ref = hf_tok(TEXTS, padding=True, truncation=True, max_length=256, return_tensors="pt")
    assert torch.equal(batch.input_ids, ref["input_ids"])
    assert torch.equal(batch.attention_mask, ref["attention_mask"].bool())
    assert torch.equal(batch.token_type_ids, ref["token_type_ids"])
    assert batch.input_ids.dtype == torch.int64 and batch.attention_mask.dtype == torch.bool
    assert batch.truncated == [t is LONG for t in TEXTS]
    assert batch.lengths[TEXTS.index(LONG)] == 256
    for row, tokens in enumerate(batch.tokens):
        assert len(tokens) == int(batch.attention_mask[row].sum())
        assert tokens[0] == "[CLS]" and tokens[-1] == "[SEP]"


def test_encode_without_offsets_gives_what_encode_batch_gives(encoder):
    # TextTokenizer.encode skips the character offsets (encode_batch_fast): nothing else moves.
    full_encodings = encoder.tokenizer.tokenizer.encode_batch(TEXTS, add_special_tokens=True)
    for ours, full in zip(encoder.tokenizer.encode(TEXTS), full_encodings, strict=True):
        assert ours.ids == full.ids and ours.type_ids == full.type_ids
        assert ours.special_tokens_mask == full.special_tokens_mask
        assert ours.attention_mask == full.attention_mask
        assert [o.ids for o in ours.overflowing] == [o.ids for o in full.overflowing]
    # Callers that show tokens (tokenize, explain) get the strings encode_batch gives.
    with_tokens = encoder.tokenizer.encode(TEXTS, with_tokens=True)
    assert [e.tokens for e in with_tokens] == [e.tokens for e in full_encodings]
    assert all(t for row in encoder.tokenize(TEXTS).tokens for t in row)  # no empty strings


def test_hidden_states_match_transformers(encoder, hf_model):
    batch = encoder.tokenize(TEXTS)
    mask = batch.attention_mask
    with torch.no_grad():
        ref = hf_model(
            input_ids=batch.input_ids,
            attention_mask=mask.long(),
            token_type_ids=batch.token_type_ids,
        ).last_hidden_state
        # HF-style 0/1 integer masks are accepted at the model's edge.
        ours = encoder.model(batch.input_ids, mask.long(), batch.token_type_ids)
    assert encoder.model.encoder.plan_for(mask).packed  # the ragged batch ran packed
    torch.testing.assert_close(ours[mask], ref[mask], atol=1e-5, rtol=0)
    assert bool((ours[~mask] == 0).all())


def test_hidden_states_match_on_every_backend(encoder, hf_model):
    batch = encoder.tokenize(TEXTS[:5])
    mask = batch.attention_mask
    with torch.no_grad():
        ref = hf_model(
            input_ids=batch.input_ids, attention_mask=mask.long(), token_type_ids=None
        ).last_hidden_state
        for backend in ("math", "sdpa"):
            model = TextEncoder.from_pretrained(backend=backend).model
            ours = model(batch.input_ids, mask)
            torch.testing.assert_close(ours[mask], ref[mask], atol=1e-5, rtol=0)


def test_embeddings_match_sentence_transformers(encoder, st_model):
    ref = st_model.encode(TEXTS, normalize_embeddings=True, convert_to_numpy=True)
    ours = encoder.encode(TEXTS, normalize=True)
    assert ours.dtype == np.float32 and ours.shape == (len(TEXTS), 384)
    cosine = (ours * ref).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(ref, axis=1)
    assert cosine.min() >= 0.99999, cosine
    np.testing.assert_allclose(ours, ref, atol=2e-6, rtol=0)


def test_unnormalized_embeddings_match(encoder, st_model):
    # all-MiniLM-L6-v2's pipeline ends in Normalize; run its first two modules (transformer,
    # pooling) for the mean-pooled vectors before normalisation.
    preprocess = getattr(st_model, "preprocess", None) or st_model.tokenize
    features = preprocess(TEXTS[:4])
    with torch.no_grad():
        pooled = st_model[1](st_model[0](features))["sentence_embedding"].numpy()
    ours = encoder.encode(TEXTS[:4], normalize=False)
    assert not np.allclose(np.linalg.norm(ours, axis=1), 1.0)
    np.testing.assert_allclose(ours, pooled, atol=1e-5, rtol=1e-5)


def test_embedding_independent_of_batch_mates_and_batch_size(encoder):
    texts = TEXTS * 3
    reference = np.stack([encoder.encode([t])[0] for t in TEXTS])
    for batch_size in (1, 5, 32):
        got = encoder.encode(texts, batch_size=batch_size)
        np.testing.assert_allclose(got, np.concatenate([reference] * 3), atol=1e-6, rtol=0)
    # the same text next to very different batch-mates
    alone = encoder.encode(["short"])[0]
    crowd = encoder.encode([LONG, "short", "x" * 500, "机器学习"])[1]
    np.testing.assert_allclose(crowd, alone, atol=1e-6, rtol=0)


def test_encode_results_in_input_order(encoder):
    texts = ["b" * 3, LONG, "a", "medium length text here", ""]
    got = encoder.encode(texts, batch_size=2)
    for i, text in enumerate(texts):
        np.testing.assert_allclose(got[i], encoder.encode([text])[0], atol=1e-6)


def test_encode_empty_list_and_progress(encoder):
    assert encoder.encode([]).shape == (0, 384)
    calls = []
    encoder.encode(["a", "b", "c"], batch_size=2, progress=lambda done, total: calls.append(done))
    assert calls == [2, 3]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"texts": "one string"}, TypeError, "list of str"),
        ({"texts": ["ok", 3]}, TypeError, r"texts\[1\] must be a str, got int"),
        ({"texts": ["ok"], "batch_size": 0}, ValueError, "batch_size must be a positive int"),
    ],
)
def test_encode_rejects_bad_input(encoder, kwargs, error, match):
    with pytest.raises(error, match=match):
        encoder.encode(**kwargs)


def test_pool_modes(encoder):
    hidden = torch.tensor([[[1.0, -2.0], [3.0, 4.0], [0.0, 0.0]]])  # (1, 3, 2), last is padding
    mask = torch.tensor([[True, True, False]])
    from clearformer.heads import pool

    torch.testing.assert_close(pool(hidden, mask, "mean"), torch.tensor([[2.0, 1.0]]))
    torch.testing.assert_close(pool(hidden, mask, "cls"), torch.tensor([[1.0, -2.0]]))
    # max ignores the padded zero row although 0 > -2
    torch.testing.assert_close(pool(hidden, mask, "max"), torch.tensor([[3.0, 4.0]]))
    assert encoder.pool(hidden, mask).shape == (1, 2)
