"""``clearformer serve`` with a multi-vector model and bge-m3, on a real uvicorn server:
``/embed_multivector`` answers ``encode_query`` / ``encode_document``'s vectors, bge-m3 answers
``/embed`` (dense), ``/embed_sparse`` (TEI's sparse format) and ``/embed_multivector``, and a
route a model does not serve is a 4xx naming the route and the model's kind."""

from __future__ import annotations

import os

import numpy as np
import pytest

from .multivector_helpers import bert_base, st_multivector_dir
from .test_serve_api import post, running_server
from .xlmr_helpers import make_bge_m3

pytest.importorskip("uvicorn")
pytest.importorskip("sentence_transformers")
httpx = pytest.importorskip("httpx")

from clearformer import BGEM3Encoder, MultiVectorEncoder  # noqa: E402
from clearformer.serve import ModelSpec, ServeConfig  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TEXTS = ["the cat, sat on the mat!", "hello", "", "quick brown fox jumps over the lazy dog"]


@pytest.fixture(scope="module")
def colbert_dir(tmp_path_factory):
    base = tmp_path_factory.mktemp("bert")
    bert_base(base)
    expansion = {"strategy": "fixed", "length": 12, "attend": False}
    return st_multivector_dir(base, tmp_path_factory.mktemp("colbert"), expansion=expansion)


@pytest.fixture(scope="module")
def m3_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("bge-m3")
    make_bge_m3(path, seed=2)
    return path


@pytest.fixture(scope="module")
def server(colbert_dir, m3_dir):
    config = ServeConfig(port=0, workers=1, max_client_batch_size=8)
    specs = [ModelSpec(str(colbert_dir), name="colbert"), ModelSpec(str(m3_dir), name="m3")]
    with running_server(config, specs) as running:
        yield running


def _vectors(response) -> list[np.ndarray]:
    assert response.status_code == 200, response.text
    return [
        np.asarray(text, dtype=np.float32).reshape(-1, len(text[0]) if text else 0)
        for text in response.json()
    ]


@pytest.mark.parametrize("mode", ["query", "document"])
def test_embed_multivector_equals_encode(server, colbert_dir, mode):
    encoder = MultiVectorEncoder.from_pretrained(colbert_dir)
    want = getattr(encoder, f"encode_{mode}")(TEXTS)
    got = _vectors(
        post(server.url, "/embed_multivector", {"inputs": TEXTS, "mode": mode, "model": "colbert"})
    )
    assert [g.shape for g in got] == [tuple(w.shape) for w in want]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w.numpy(), atol=1e-6, rtol=0)
    if mode == "query":  # expanded to 12 tokens; documents are not
        assert {g.shape[0] for g in got} == {12}


def test_bge_m3_answers_three_routes(server, m3_dir):
    encoder = BGEM3Encoder.from_pretrained(m3_dir)
    out = encoder.encode(TEXTS)
    dense = post(server.url, "/embed", {"inputs": TEXTS, "model": "m3"})
    assert dense.status_code == 200, dense.text
    np.testing.assert_allclose(
        np.asarray(dense.json(), dtype=np.float32), out.dense.numpy(), atol=1e-6
    )
    sparse = post(server.url, "/embed_sparse", {"inputs": TEXTS, "model": "m3"})
    assert sparse.status_code == 200, sparse.text
    for i, row in enumerate(sparse.json()):
        want = out.sparse[i].coalesce()
        assert [e["index"] for e in row] == want.indices()[0].tolist()
        np.testing.assert_allclose([e["value"] for e in row], want.values().numpy(), atol=1e-6)
    colbert = _vectors(
        post(server.url, "/embed_multivector", {"inputs": TEXTS, "mode": "query", "model": "m3"})
    )
    for g, w in zip(colbert, out.colbert, strict=True):
        np.testing.assert_allclose(g, w.numpy(), atol=1e-6, rtol=0)


def test_a_route_the_model_does_not_serve_names_route_and_kind(server):
    wrong = post(server.url, "/embed", {"inputs": ["hello"], "model": "colbert"})
    assert 400 <= wrong.status_code < 500
    message = wrong.json()["error"]
    assert "model 'colbert' is a multi-vector (ColBERT) model, which /embed" in message
    assert "/embed_multivector" in message
    sparse = post(server.url, "/embed_sparse", {"inputs": ["hello"], "model": "colbert"})
    assert 400 <= sparse.status_code < 500 and "/embed_multivector" in sparse.json()["error"]


def test_bad_bodies_are_422_naming_the_field(server):
    no_mode = post(server.url, "/embed_multivector", {"inputs": ["hello"], "model": "colbert"})
    assert no_mode.status_code == 422 and "mode" in no_mode.json()["error"]
    bad = post(server.url, "/embed_multivector", {"inputs": 3, "mode": "query"})
    assert bad.status_code == 422 and "inputs" in bad.json()["error"]


def test_bge_m3_holds_to_each_field_or_refuses_it_by_name(server, m3_dir):
    long = "quick brown fox jumps over the lazy dog " * 20  # past bge-m3's token limit
    m3 = BGEM3Encoder.from_pretrained(m3_dir)
    assert m3.tokenizer.encode([long])[0].overflowing  # encode cuts it

    def answer(path, **fields):
        response = post(server.url, path, {"inputs": [long], "model": "m3", **fields})
        error = response.json()["error"] if response.status_code != 200 else ""
        return response.status_code, error

    for path in ("/embed", "/embed_sparse"):
        # Not sent, or true: cut at the end, as encode cuts it.
        assert answer(path)[0] == 200
        assert answer(path, truncate=True)[0] == 200
        status, error = answer(path, truncate=False)
        assert status == 413 and "inputs[0] has" in error and "model 'm3'" in error
        status, error = answer(path, truncation_direction="left", truncate=True)
        assert status == 422 and "truncation_direction must be 'right'" in error
        assert "model 'm3'" in error and "got 'left'" in error
    status, error = answer("/embed", normalize=False)
    assert status == 422 and "normalize must be true for model 'm3'" in error
    assert "got false" in error
    assert answer("/embed", normalize=True)[0] == 200
    status, error = answer("/embed_sparse", task="query")
    assert status == 422 and "task must be 'document' for model 'm3'" in error
    assert "got 'query'" in error
    assert answer("/embed_sparse", task="document")[0] == 200
