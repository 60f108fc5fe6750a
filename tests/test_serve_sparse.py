"""``clearformer serve`` with a sparse (SPLADE) model: TEI's ``POST /embed_sparse`` on a real
uvicorn server, against ``SparseEncoder.encode_document`` / ``encode_query`` (which the tests
of test_sparse_encoder.py hold to sentence-transformers); ``/embed`` on a sparse model and
``/embed_sparse`` on a dense one refused (4xx naming the route and the model's kind); the
input limit; /info."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("uvicorn")
pytest.importorskip("starlette")
pytest.importorskip("sentence_transformers")
httpx = pytest.importorskip("httpx")

from clearformer import SparseEncoder  # noqa: E402
from clearformer.serve import ModelSpec, ServeConfig  # noqa: E402

from .sparse_helpers import TEXTS, V, inference_free_dir, splade_dir, write_mlm  # noqa: E402
from .test_serve_api import running_server  # noqa: E402


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve-sparse")
    base = write_mlm(root / "mlm")
    from .family_helpers import sentence_dir

    return {
        "splade": splade_dir(base, root / "splade"),
        "free": inference_free_dir(base, root / "free"),
        "dense": sentence_dir(base, root / "dense"),
    }


def as_dense(answer: list[list[dict]]) -> torch.Tensor:
    out = torch.zeros(len(answer), V)
    for row, entries in enumerate(answer):
        indices = [e["index"] for e in entries]
        assert indices == sorted(indices)
        for entry in entries:
            out[row, entry["index"]] = entry["value"]
    return out


def test_embed_sparse_equals_encode(dirs):
    config = ServeConfig(port=0, workers=1, max_client_batch_size=16)
    specs = [
        ModelSpec(str(dirs["splade"])),
        ModelSpec(str(dirs["free"])),
        ModelSpec(str(dirs["dense"])),
    ]
    splade = SparseEncoder.from_pretrained(dirs["splade"])
    free = SparseEncoder.from_pretrained(dirs["free"])
    with running_server(config, specs) as server:
        post = lambda path, body: httpx.post(server.url + path, json=body, timeout=30)  # noqa: E731
        # The last text is over the model's 64 tokens: cut, as encode cuts it.
        answer = post("/embed_sparse", {"inputs": TEXTS, "truncate": True})
        assert answer.status_code == 200, answer.text
        want = splade.encode_document(TEXTS).to_dense()
        torch.testing.assert_close(as_dense(answer.json()), want, atol=1e-6, rtol=0)
        # A single string is one input; an empty text's row is still a list.
        one = post("/embed_sparse", {"inputs": TEXTS[0]}).json()
        assert len(one) == 1 and one[0] == answer.json()[0]
        # The inference-free model: documents through SPLADE, queries looked up.
        for task, method in (("document", free.encode_document), ("query", free.encode_query)):
            body = {"inputs": TEXTS, "model": "free", "task": task, "truncate": True}
            got = post("/embed_sparse", body)
            assert got.status_code == 200, got.text
            torch.testing.assert_close(
                as_dense(got.json()), method(TEXTS).to_dense(), atol=1e-6, rtol=0
            )
        # Negative control: the two tasks of the inference-free model differ.
        body = {"inputs": TEXTS, "model": "free", "task": "query", "truncate": True}
        queries = as_dense(post("/embed_sparse", body).json())
        assert not torch.allclose(queries, free.encode_document(TEXTS).to_dense())

        refused = post("/embed", {"inputs": ["hello"], "model": "splade"})
        assert refused.status_code == 422
        message = refused.json()["error"]
        assert "sparse" in message and "/embed" in message and "/embed_sparse" in message
        refused = post("/embed_sparse", {"inputs": ["hello"], "model": "dense"})
        assert refused.status_code == 422
        message = refused.json()["error"]
        assert "model 'dense' is an embedding model, which /embed_sparse" in message
        for task in ("passage", ""):
            bad = post("/embed_sparse", {"inputs": ["hello"], "task": task})
            assert bad.status_code == 422 and "task" in bad.json()["error"], task

        info = httpx.get(server.url + "/info", timeout=30).json()
        assert info["model_type"] == {"embedding": {"pooling": "splade-max"}}
        assert info["dimensions"] == V


def test_embed_sparse_without_a_sparse_model_and_the_limit(dirs):
    config = ServeConfig(port=0, workers=1, max_input_tokens=4)
    with running_server(config, [ModelSpec(str(dirs["dense"]))]) as server:
        refused = httpx.post(server.url + "/embed_sparse", json={"inputs": ["a"]}, timeout=30)
        assert refused.status_code == 422
        assert "/embed_sparse needs a sparse" in refused.json()["error"]
    with running_server(config, [ModelSpec(str(dirs["splade"]))]) as server:
        long = {"inputs": ["the cat sat on the mat"]}
        refused = httpx.post(server.url + "/embed_sparse", json=long, timeout=30)
        assert refused.status_code == 413 and "limit of 4 tokens" in refused.json()["error"]
        cut = httpx.post(server.url + "/embed_sparse", json={**long, "truncate": True}, timeout=30)
        assert cut.status_code == 200
        refused = httpx.post(server.url + "/embed", json={"inputs": ["a"]}, timeout=30)
        assert (
            refused.status_code == 422 and "(sparse, on /embed_sparse)" in refused.json()["error"]
        )


def test_each_side_keeps_its_own_length_limit(dirs, tmp_path):
    """A side that cuts shorter than the server's limit (a SPLADE model's query_length, an
    inference-free table's model_max_length) cuts there in the server too, as encode_query
    does; without "truncate" such an input is refused with the side's limit."""
    import json
    import shutil

    from sentence_transformers import SparseEncoder as STSparseEncoder
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sparse_encoder.modules import SpladePooling

    from clearformer.serve.errors import ApiError
    from clearformer.serve.sparse import load_sparse

    base = dirs["splade"].parent / "mlm"
    short_queries = tmp_path / "short-queries"
    side = Transformer(str(base), transformer_task="fill-mask", query_length=8, document_length=32)
    STSparseEncoder(modules=[side, SpladePooling("max")], device="cpu").save(str(short_queries))
    short_table = tmp_path / "short-table"
    shutil.copytree(dirs["free"], short_table)
    (config_file,) = short_table.glob("query_*/tokenizer_config.json")
    settings = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**settings, "model_max_length": 4}))

    text = "the quick brown fox jumps over the lazy dog and runs far far away"
    for path, limit in ((short_queries, 8), (short_table, 4)):
        served = load_sparse(
            ModelSpec(str(path)), max_input_tokens=None, precision="float32", backend="auto"
        )
        encoder = SparseEncoder.from_pretrained(path)
        prepared = served.prepare_sparse([text, "dog"], task="query", truncate=True)
        assert max(len(e.ids) for e in prepared.encodings) == limit
        rows = torch.from_numpy(served.run(prepared.encodings, prepared.options))
        torch.testing.assert_close(
            rows, encoder.encode_query([text, "dog"]).to_dense(), atol=1e-6, rtol=0
        )
        with pytest.raises(ApiError, match=f"over the limit of {limit} tokens per input for query"):
            served.prepare_sparse([text], task="query", truncate=False)
        # Documents keep the server's (the document side's) longer limit.
        document = served.prepare_sparse([text], task="document", truncate=False)
        assert len(document.encodings[0].ids) > limit


def test_prompt_name_is_refused_where_no_named_prompt_applies(dirs):
    """The task picks a sparse model's prompt: a prompt_name on /embed_sparse, or on /tokenize
    for a sparse model, would be taken and not applied."""
    config = ServeConfig(port=0, workers=1)
    with running_server(config, [ModelSpec(str(dirs["splade"]), "splade")]) as server:
        post = lambda path, body: httpx.post(server.url + path, json=body, timeout=30)  # noqa: E731
        sparse = post("/embed_sparse", {"inputs": ["a"], "prompt_name": "query"})
        assert sparse.status_code == 422
        assert sparse.json()["error"] == (
            "prompt_name must be left out on /embed_sparse, where task ('query' or 'document') "
            "picks the model's prompt, got 'query'"
        )
        tokens = post("/tokenize", {"inputs": ["a"], "prompt_name": "query"})
        assert tokens.status_code == 422
        assert tokens.json()["error"] == (
            "prompt_name must be left out for model 'splade', a sparse model: it names an "
            "embedding model's prompt, got 'query'"
        )
        assert post("/embed_sparse", {"inputs": ["a"], "task": "query"}).status_code == 200
        assert post("/tokenize", {"inputs": ["a"]}).status_code == 200
