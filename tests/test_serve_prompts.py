"""The checkpoint's prompts in the server's models: ``/rerank`` puts the cross-encoder's default
prompt before each query, as ``CrossEncoder.predict`` does, and a left truncation keeps a
prompt whole and cuts the text after it (embeddings, SPLADE, rerank), so a pooling that leaves
the prompt out skips the prompt's tokens and no others. The Python API has no left truncation:
the expected tokens are cut by hand, and the expected rows are the API's for the text so cut."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from .helpers import write_tiny_bert

pytest.importorskip("starlette")
pytest.importorskip("prometheus_client")

from clearformer.serve.models import ModelSpec, load_model  # noqa: E402
from clearformer.text import CrossEncoder, TextEncoder  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b", "c", "cat", "dog", "sat", "on"]
CLS, SEP = 2, 3
ID = {word: i for i, word in enumerate(WORDS)}


def _ids(words: str) -> list[int]:
    return [ID[w] for w in words.split()]


def _w(*numbers: int) -> list[int]:
    """The ids of words ``w<n>`` in make_classifier's vocabulary (five specials, then w0...)."""
    return [5 + n for n in numbers]


def _prompts(path, prompts: dict, default: str | None = None) -> None:
    file = path / "config_sentence_transformers.json"
    config = json.loads(file.read_text()) if file.exists() else {}
    config["prompts"] = prompts
    if default is not None:
        config["default_prompt_name"] = default
    file.write_text(json.dumps(config))


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    pytest.importorskip("transformers")
    from .test_sequence_classification import make_classifier

    path = tmp_path_factory.mktemp("prompted-reranker")
    make_classifier("bert", path, num_labels=1)
    _prompts(path, {"q": "w5 w6 w7 "}, default="q")
    return path


@pytest.fixture(scope="module")
def prompt_left_out(tmp_path_factory):
    """A tiny BERT whose mean pooling leaves its prompt out (``include_prompt`` false)."""
    path = write_tiny_bert(tmp_path_factory.mktemp("prompt-left-out"), WORDS)
    (path / "modules.json").write_text(
        json.dumps(
            [
                {
                    "idx": 0,
                    "name": "0",
                    "path": "",
                    "type": "sentence_transformers.models.Transformer",
                },
                {
                    "idx": 1,
                    "name": "1",
                    "path": "1_Pooling",
                    "type": "sentence_transformers.models.Pooling",
                },
            ]
        )
    )
    (path / "1_Pooling").mkdir()
    pooling = {"word_embedding_dimension": 16, "pooling_mode": "mean", "include_prompt": False}
    (path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    _prompts(path, {"q": "dog dog "})
    return path


def _served(path, limit: int | None = None):
    return load_model(
        ModelSpec(str(path)), max_input_tokens=limit, precision="float32", backend="auto"
    )


def _rows(served, prepared) -> np.ndarray:
    return served.run(prepared.encodings, prepared.options)


def test_rerank_scores_with_the_default_prompt_as_predict(reranker):
    served = _served(reranker)
    texts = ["w8 w9", "w10 w11 w12"]
    want = CrossEncoder.from_pretrained(reranker).predict([("w1 w2", t) for t in texts])
    prepared = served.prepare_pairs("w1 w2", texts, activation=served.model.activation)
    np.testing.assert_allclose(_rows(served, prepared)[:, 0], want, atol=1e-6, rtol=0)
    # The prompt is in the tokens: [CLS], then its three words, then the query's.
    assert [len(e.ids) for e in prepared.encodings][0] == 1 + 3 + 2 + 1 + 2 + 1


def test_left_truncation_keeps_a_prompt_the_pooling_leaves_out(prompt_left_out):
    served = _served(prompt_left_out, limit=8)
    encoder = TextEncoder.from_pretrained(prompt_left_out)
    assert not encoder.include_prompt
    text = "a b c cat dog sat on a b c"
    prepared = served.prepare(
        [text, "cat"],
        field="inputs",
        normalize=True,
        truncate=True,
        direction="left",
        prompt_name="q",
    )
    # The prompt's [CLS] dog dog stay; the text loses its first words, not the prompt.
    assert list(prepared.encodings[0].ids) == [CLS, *_ids("dog dog on a b c"), SEP]
    assert list(prepared.encodings[1].ids) == [CLS, *_ids("dog dog cat"), SEP]  # not cut
    assert prepared.encodings[0].overflowing and not prepared.encodings[1].overflowing
    want = encoder.encode(["on a b c", "cat"], prompt_name="q", normalize=True)
    np.testing.assert_allclose(_rows(served, prepared), want, atol=1e-6, rtol=0)
    # A right cut is still the tokenizer's: the end goes.
    right = served.prepare(
        [text],
        field="inputs",
        normalize=True,
        truncate=True,
        direction="right",
        prompt_name="q",
    )
    assert list(right.encodings[0].ids) == [CLS, *_ids("dog dog a b c cat"), SEP]


def test_left_truncation_keeps_the_rerank_prompt(reranker):
    served = _served(reranker, limit=12)
    model = CrossEncoder.from_pretrained(reranker)
    query = "w1 w2 w3 w4 w5 w6 w8 w9 w10 w11"  # 3 + 10 tokens on the query's side
    prepared = served.prepare_pairs(
        query, ["w20 w21"], activation=model.activation, truncate=True, direction="left"
    )
    # 12 tokens: [CLS] 7 [SEP] 2 [SEP]; the query side keeps the prompt and its last 4 words.
    (cut,) = prepared.encodings
    want_ids = [CLS, *_w(5, 6, 7, 8, 9, 10, 11), SEP, *_w(20, 21), SEP]
    assert list(cut.ids) == want_ids
    want = model.predict([("w8 w9 w10 w11", "w20 w21")])
    np.testing.assert_allclose(_rows(served, prepared)[:, 0], want, atol=1e-6, rtol=0)


def test_left_truncation_keeps_the_splade_prompt(tmp_path):
    pytest.importorskip("sentence_transformers")
    from clearformer import SparseEncoder
    from clearformer.serve.sparse import load_sparse

    from .sparse_helpers import splade_dir, write_mlm

    path = splade_dir(write_mlm(tmp_path / "mlm"), tmp_path / "splade")
    _prompts(path, {"document": "hello world "})
    served = load_sparse(
        ModelSpec(str(path)), max_input_tokens=8, precision="float32", backend="auto"
    )
    text = "the quick brown fox jumps over the lazy"
    prepared = served.prepare_sparse([text], task="document", truncate=True, direction="left")
    (cut,) = prepared.encodings
    tokens = served._full.encode("hello world jumps over the lazy").ids  # 8 tokens
    assert list(cut.ids) == tokens
    want = SparseEncoder.from_pretrained(path).encode_document(["jumps over the lazy"]).to_dense()
    got = torch.from_numpy(_rows(served, prepared))
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
