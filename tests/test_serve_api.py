"""``clearformer serve``'s endpoints against their specs, on tiny random models and a real
uvicorn server on loopback: OpenAI's ``/v1/embeddings`` through the ``openai`` client, TEI's
``/embed``, ``/rerank``, ``/tokenize``, ``/health``, ``/info``; ``/metrics``; the API key
(401); the limits (413); a flood (429 at once); a client that disconnects; the request
timeout. Ordering is held by a gate on the batch workers, never by timing."""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pytest

from .helpers import write_tiny_bert

pytest.importorskip("uvicorn")
pytest.importorskip("starlette")
pytest.importorskip("prometheus_client")
httpx = pytest.importorskip("httpx")

from clearformer.serve import ModelSpec, ServeConfig, create_app  # noqa: E402
from clearformer.serve.models import ServedModel  # noqa: E402
from clearformer.text import CrossEncoder, TextEncoder  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b", "c", "cat", "dog", "sat", "on"]
TEXTS = ["a cat sat on a mat", "dog", "b c", "", "cat cat cat dog dog a b c"]
WAIT = 60.0  # seconds a helper waits for a state before failing (a hang, not a slowness)


# Helpers shared with the other test_serve files -------------------------------------------


@dataclass
class Running:
    url: str
    state: object  # clearformer.serve.state.ServerState
    server: object  # uvicorn.Server


@contextlib.contextmanager
def running_server(config: ServeConfig, specs: list[ModelSpec]) -> Iterator[Running]:
    """The app on a real uvicorn server on 127.0.0.1 (a free port), in a thread, ready."""
    import uvicorn

    app = create_app(config, specs)
    state = app.state.serve
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    server = uvicorn.Server(
        uvicorn.Config(app, log_config=None, lifespan="on", timeout_graceful_shutdown=5)
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        assert state.settled.wait(WAIT), "the models did not load"
        assert state.status == "ready", state.load_error
        wait_for(lambda: server.started)
        yield Running(f"http://127.0.0.1:{sock.getsockname()[1]}", state, server)
    finally:
        server.should_exit = True
        thread.join(WAIT)
        sock.close()


def wait_for(predicate, what: str = "a condition") -> None:
    """Poll ``predicate`` until true; fail after :data:`WAIT` seconds (a hang)."""
    deadline = time.monotonic() + WAIT
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {WAIT:g} s for {what}")
        time.sleep(0.005)


class Gate:
    """Holds every batch the workers start from now on until :meth:`open`; records each
    batch's token ids. Installed after warm-up, so only requests' batches meet it."""

    def __init__(self, monkeypatch) -> None:
        self.opened = threading.Event()
        self.batches: list[list[tuple[int, ...]]] = []
        self._lock = threading.Lock()
        original = ServedModel.run

        def run(model, encodings, options):
            with self._lock:
                self.batches.append([tuple(e.ids) for e in encodings])
            self.opened.wait()
            return original(model, encodings, options)

        monkeypatch.setattr(ServedModel, "run", run)

    def started(self) -> int:
        with self._lock:
            return len(self.batches)

    def open(self) -> None:
        self.opened.set()


def post(url: str, path: str, body, **kwargs) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=WAIT, **kwargs)


def floats(response: httpx.Response) -> np.ndarray:
    assert response.status_code == 200, response.text
    return np.asarray(response.json(), dtype=np.float32)


# Fixtures ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_bert(tmp_path_factory.mktemp("tiny-serve"), WORDS)


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    pytest.importorskip("transformers")
    from .test_sequence_classification import make_classifier

    path = tmp_path_factory.mktemp("tiny-reranker")
    make_classifier("bert", path, num_labels=1)
    return path


@pytest.fixture(scope="module")
def server(tiny, reranker):
    config = ServeConfig(port=0, workers=1, max_client_batch_size=8)
    specs = [ModelSpec(str(tiny), "tiny"), ModelSpec(str(reranker), "ranker")]
    with running_server(config, specs) as running:
        yield running


@pytest.fixture(scope="module")
def encoder(tiny):
    return TextEncoder.from_pretrained(tiny)


# Endpoints against their specs ------------------------------------------------------------


def test_health_says_loading_until_the_models_are_ready(tiny):
    from starlette.testclient import TestClient

    app = create_app(ServeConfig(), [ModelSpec(str(tiny))])
    client = TestClient(app)  # not entered: the lifespan, which loads, never starts
    assert client.get("/health").status_code == 503
    assert client.get("/health").json() == {"status": "loading"}
    refused = client.post("/embed", json={"inputs": "a"})
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert "loading" in refused.json()["error"]


def test_health_info_and_models(server):
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    info = httpx.get(server.url + "/info").json()
    assert info["model_id"] == "tiny" and info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert info["max_input_length"] == 32 and info["max_client_batch_size"] == 8
    assert [m["model_id"] for m in info["models"]] == ["tiny", "ranker"]
    assert info["models"][1]["model_type"]["reranker"]["id2label"] == {"0": "LABEL_0"}
    listed = httpx.get(server.url + "/v1/models").json()
    assert [m["id"] for m in listed["data"]] == ["tiny", "ranker"]


def test_embed_gives_encodes_rows(server, encoder):
    rows = floats(post(server.url, "/embed", {"inputs": TEXTS}))
    np.testing.assert_array_equal(rows, encoder.encode(TEXTS, normalize=True))
    # A single string is a batch of one, as TEI answers it.
    one = floats(post(server.url, "/embed", {"inputs": TEXTS[0]}))
    np.testing.assert_array_equal(one, rows[:1])
    raw = floats(post(server.url, "/embed", {"inputs": TEXTS, "normalize": False}))
    np.testing.assert_array_equal(raw, encoder.encode(TEXTS, normalize=False))
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0)


def test_dimensions_keep_the_first_values_then_normalise(server, encoder):
    rows = floats(post(server.url, "/embed", {"inputs": TEXTS, "dimensions": 5}))
    full = encoder.encode(TEXTS, normalize=False)[:, :5]
    expected = full / np.linalg.norm(full, axis=1, keepdims=True)
    assert rows.shape == (len(TEXTS), 5)
    np.testing.assert_allclose(rows, expected, rtol=0, atol=1e-6)
    whole = post(server.url, "/embed", {"inputs": TEXTS, "dimensions": 16})
    np.testing.assert_array_equal(floats(whole), encoder.encode(TEXTS, normalize=True))
    too_wide = post(server.url, "/embed", {"inputs": "a", "dimensions": 17})
    assert too_wide.status_code == 422 and "width of 16" in too_wide.json()["error"]


def test_dimensions_normalise_only_where_the_model_does_as_encode(server, encoder):
    # docs/serving.md: the OpenAI route follows the model's own normalisation (tiny: none), so
    # a shortened row is the first values as they are, encode(dimensions=...)'s row.
    answer = post(server.url, "/v1/embeddings", {"input": TEXTS, "model": "tiny", "dimensions": 4})
    assert answer.status_code == 200, answer.text
    rows = np.float32([d["embedding"] for d in answer.json()["data"]])
    np.testing.assert_allclose(rows, encoder.encode(TEXTS, dimensions=4), rtol=0, atol=1e-6)
    assert not np.allclose(np.linalg.norm(rows, axis=1), 1.0)


def test_the_openai_client_reads_embeddings_floats_and_base64(server, encoder):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    expected = encoder.encode(TEXTS)
    for fmt in ("float", "base64"):
        answer = client.embeddings.create(model="tiny", input=TEXTS, encoding_format=fmt)
        if fmt == "float":
            got = np.asarray([d.embedding for d in answer.data], dtype=np.float32)
        else:  # asked for by name, the client hands the strings over as they came
            got = np.stack(
                [np.frombuffer(base64.b64decode(d.embedding), "<f4") for d in answer.data]
            )
        np.testing.assert_array_equal(got, expected)
        assert [d.index for d in answer.data] == list(range(len(TEXTS)))
        assert answer.model == "tiny" and answer.object == "list"
        tokens = sum(len(t) for t in encoder.tokenize(TEXTS).tokens)
        assert answer.usage.prompt_tokens == answer.usage.total_tokens == tokens
    # The client's default asks for base64 and decodes it itself.
    single = client.embeddings.create(model="tiny", input=TEXTS[0])
    np.testing.assert_array_equal(np.float32(single.data[0].embedding), expected[0])
    short = client.embeddings.create(model="tiny", input=TEXTS, dimensions=4)
    assert len(short.data[0].embedding) == 4
    with pytest.raises(openai.NotFoundError, match="'gpt' is not served"):
        client.embeddings.create(model="gpt", input="a")
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model="tiny", input=[])
    # models.retrieve: GET /v1/models/{model}, a served model or a 404.
    assert [client.models.retrieve(name).id for name in ("tiny", "ranker")] == ["tiny", "ranker"]
    with pytest.raises(openai.NotFoundError, match="'gpt' is not served"):
        client.models.retrieve("gpt")


def test_base64_is_little_endian_float32(server, encoder):
    answer = post(server.url, "/v1/embeddings", {"input": "dog", "encoding_format": "base64"})
    raw = base64.b64decode(answer.json()["data"][0]["embedding"])
    np.testing.assert_array_equal(np.frombuffer(raw, "<f4"), encoder.encode(["dog"])[0])


def test_rerank_orders_by_the_cross_encoders_scores(server, reranker):
    model = CrossEncoder.from_pretrained(reranker)
    texts = ["w1 w2 w3", "w4", "w1 w2", "w9 w8 w7 w6", "w3"]
    expected = model.predict([("w1 w2", t) for t in texts])
    ranked = post(server.url, "/rerank", {"query": "w1 w2", "texts": texts}).json()
    assert [r["index"] for r in ranked] == np.argsort(-expected, kind="stable").tolist()
    np.testing.assert_array_equal(
        np.float32([r["score"] for r in ranked]), expected[[r["index"] for r in ranked]]
    )
    assert all("text" not in r for r in ranked)
    raw = post(
        server.url,
        "/rerank",
        {"query": "w1 w2", "texts": texts, "raw_scores": True, "return_text": True},
    ).json()
    logits = model.predict([("w1 w2", t) for t in texts], activation="identity")
    assert {r["index"]: np.float32(r["score"]) for r in raw} == dict(enumerate(logits))
    assert [r["text"] for r in raw] == [texts[r["index"]] for r in raw]


def test_models_of_the_other_kind_are_refused(server):
    wrong = post(server.url, "/embed", {"inputs": "a", "model": "ranker"})
    assert wrong.status_code == 422 and "use /rerank" in wrong.json()["error"]
    wrong = post(server.url, "/rerank", {"query": "a", "texts": ["b"], "model": "tiny"})
    assert wrong.status_code == 422 and "/embed" in wrong.json()["error"]
    missing = post(server.url, "/embed", {"inputs": "a", "model": "nope"})
    assert missing.status_code == 404 and missing.json()["error_type"] == "NotFound"


def test_tokenize_gives_tokens_with_character_offsets(server):
    tokens = post(server.url, "/tokenize", {"inputs": "cat  sat"}).json()
    assert tokens == [
        [
            {"id": 2, "text": "[CLS]", "special": True, "start": None, "stop": None},
            {"id": 8, "text": "cat", "special": False, "start": 0, "stop": 3},
            {"id": 10, "text": "sat", "special": False, "start": 5, "stop": 8},
            {"id": 3, "text": "[SEP]", "special": True, "start": None, "stop": None},
        ]
    ]
    bare = post(server.url, "/tokenize", {"inputs": ["a", "b"], "add_special_tokens": False})
    assert [[t["text"] for t in row] for row in bare.json()] == [["a"], ["b"]]


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        ({"inputs": 3}, 422, "inputs must be a string or a list of strings, got a number (3)"),
        ({"inputs": ["a", None]}, 422, "inputs[1] must be a string, got null"),
        ({"inputs": []}, 400, "inputs must not be empty"),
        ({"inputs": "a", "normalize": "yes"}, 422, "normalize must be true or false"),
        ({"inputs": "a", "prompt_name": "query"}, 422, "prompt_name must be one of"),
        ({"inputs": "a", "truncation_direction": "up"}, 422, "'right' or 'left', got 'up'"),
        ({"inputs": "a", "dimensions": 0}, 422, "dimensions must be a positive integer"),
        ([1, 2], 422, "the body must be a JSON object, got a list"),
    ],
)
def test_bad_bodies_are_named(server, body, status, fragment):
    answer = post(server.url, "/embed", body)
    assert answer.status_code == status, answer.text
    assert fragment in answer.json()["error"]


def test_text_that_is_not_unicode_is_named(server):
    # A JSON escape can carry half a UTF-16 pair, which no tokenizer takes.
    body = b'{"inputs": ["a", "x\\ud800"]}'
    answer = httpx.post(server.url + "/embed", content=body, timeout=WAIT)
    assert answer.status_code == 422
    assert "inputs[1] is not valid Unicode text: a lone surrogate U+D800" in answer.json()["error"]


def test_errors_take_each_apis_shape(server):
    not_json = httpx.post(server.url + "/embed", content=b"{", timeout=WAIT)
    assert not_json.status_code == 400
    assert not_json.json()["error_type"] == "Malformed"
    openai_shape = post(server.url, "/v1/embeddings", {"input": [1, 2]}).json()
    assert openai_shape["error"]["param"] == "input"
    assert openai_shape["error"]["type"] == "invalid_request_error"
    assert "token-id arrays are not accepted" in openai_shape["error"]["message"]
    assert httpx.get(server.url + "/nope").json()["error_type"] == "NotFound"


# Limits -----------------------------------------------------------------------------


def test_too_many_inputs_and_too_large_a_body_are_413(server):
    many = post(server.url, "/embed", {"inputs": ["a"] * 9})
    assert many.status_code == 413
    assert "9 inputs, over the limit of 8" in many.json()["error"]
    big = httpx.post(server.url + "/embed", content=b"x" * 2_000_001, timeout=WAIT)
    assert big.status_code == 413 and "payload_limit" in big.json()["error"]


def test_a_long_input_is_413_naming_the_limit_unless_truncated(server, encoder):
    long = " ".join(["cat"] * 40)  # 42 tokens, the model takes 32
    refused = post(server.url, "/embed", {"inputs": ["a", long]})
    assert refused.status_code == 413
    assert refused.json()["error"].startswith("inputs[1] has 42 tokens, over the limit of 32")
    cut = floats(post(server.url, "/embed", {"inputs": ["a", long], "truncate": True}))
    np.testing.assert_array_equal(cut, encoder.encode(["a", long], normalize=True))  # cut too
    left = floats(
        post(
            server.url,
            "/embed",
            {"inputs": "dog " + long, "truncate": True, "truncation_direction": "Left"},
        )
    )
    np.testing.assert_array_equal(left, encoder.encode([long], normalize=True))  # start cut
    ranked = post(server.url, "/rerank", {"query": long * 2, "texts": ["w1"] * 2})
    assert ranked.status_code == 413 and ranked.json()["error"].startswith("query has ")
    pair = post(server.url, "/rerank", {"query": "w1", "texts": ["w1", long * 2]})
    assert pair.status_code == 413
    assert pair.json()["error"].startswith("the pair (query, texts[1]) has ")


def test_an_input_over_the_batch_budget_runs_alone(tiny, encoder):
    config = ServeConfig(port=0, workers=1, max_batch_tokens=4)
    with running_server(config, [ModelSpec(str(tiny))]) as running:
        texts = ["cat " * 20, "a", "dog dog dog"]
        rows = floats(post(running.url, "/embed", {"inputs": texts}))
    np.testing.assert_array_equal(rows, encoder.encode(texts, normalize=True))


def test_api_key_is_required_compared_and_never_logged(tiny, caplog):
    key = "s3cret-key-value"
    config = ServeConfig(port=0, workers=1, api_key=key)
    assert key not in repr(config)
    caplog.set_level(logging.DEBUG)
    with running_server(config, [ModelSpec(str(tiny), "tiny")]) as running:
        body = {"inputs": "a"}
        assert post(running.url, "/embed", body).status_code == 401
        wrong = post(running.url, "/embed", body, headers={"Authorization": "Bearer s3cret"})
        assert wrong.status_code == 401 and wrong.headers["www-authenticate"] == "Bearer"
        assert wrong.json()["error_type"] == "Unauthorized"
        basic = post(running.url, "/embed", body, headers={"Authorization": f"Basic {key}"})
        assert basic.status_code == 401
        good = post(running.url, "/embed", body, headers={"Authorization": f"Bearer {key}"})
        assert good.status_code == 200
        assert httpx.get(running.url + "/metrics").status_code == 401
        assert httpx.get(running.url + "/health").status_code == 200  # load balancers' probe
        openai = pytest.importorskip("openai")
        client = openai.OpenAI(base_url=running.url + "/v1", api_key=key, max_retries=0)
        assert len(client.embeddings.create(model="tiny", input="a").data) == 1
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=running.url + "/v1", api_key="x", max_retries=0).models.list()
    assert key not in caplog.text


# Backpressure -----------------------------------------------------------------------


def test_a_flood_gets_429_at_once_and_the_admitted_finish(tiny, encoder, monkeypatch):
    config = ServeConfig(port=0, workers=1, max_concurrent_requests=3)
    with running_server(config, [ModelSpec(str(tiny))]) as running:
        gate = Gate(monkeypatch)
        with ThreadPoolExecutor(3) as pool:
            admitted = [
                pool.submit(post, running.url, "/embed", {"inputs": [t]}) for t in TEXTS[:3]
            ]
            wait_for(lambda: running.state.in_flight == 3, "3 requests admitted")
            # The gate holds the admitted ones, so every one of these finds the queue full.
            with ThreadPoolExecutor(8) as flood:
                refused = list(
                    flood.map(lambda i: post(running.url, "/embed", {"inputs": "a"}), range(40))
                )
            assert {r.status_code for r in refused} == {429}
            assert all(int(r.headers["retry-after"]) >= 1 for r in refused)
            assert refused[0].json()["error_type"] == "Overloaded"
            assert "max_concurrent_requests" in refused[0].json()["error"]
            gate.open()
            rows = [floats(f.result()) for f in admitted]
        np.testing.assert_array_equal(
            np.concatenate(rows), encoder.encode(TEXTS[:3], normalize=True)
        )
        metrics = httpx.get(running.url + "/metrics").text
        assert 'clearformer_requests_total{endpoint="embed",status="429"} 40.0' in metrics
        assert 'clearformer_requests_total{endpoint="embed",status="200"} 3.0' in metrics
        assert "clearformer_requests_in_flight 0.0" in metrics
        assert running.state.batcher.queued == 0


def _raw_post(url: str, path: str, body: dict) -> socket.socket:
    """Send a request and return the open socket, unread (to close it, as a client that
    gives up does)."""
    host, port = url.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)))
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    )
    sock.sendall(head.encode() + payload)
    return sock


def test_a_client_that_disconnects_frees_its_slot_and_its_inputs(tiny, monkeypatch):
    config = ServeConfig(port=0, workers=1, max_concurrent_requests=2)
    with running_server(config, [ModelSpec(str(tiny))]) as running:
        gate = Gate(monkeypatch)
        with ThreadPoolExecutor(2) as pool:
            held = pool.submit(post, running.url, "/embed", {"inputs": "a"})
            wait_for(lambda: gate.started() == 1, "the first batch")
            gone = _raw_post(running.url, "/embed", {"inputs": "dog dog dog dog dog"})
            wait_for(lambda: running.state.batcher.queued == 1, "the second request queued")
            assert post(running.url, "/embed", {"inputs": "b"}).status_code == 429  # full
            gone.close()
            wait_for(lambda: running.state.in_flight == 1, "the slot freed")
            assert running.state.batcher.queued == 0  # its input left the queue
            later = pool.submit(post, running.url, "/embed", {"inputs": "c"})
            wait_for(lambda: running.state.in_flight == 2, "the next request admitted")
            gate.open()
            assert held.result().status_code == 200 and later.result().status_code == 200
        ran = [ids for batch in gate.batches for ids in batch]
        assert (2, 9, 9, 9, 9, 9, 3) not in ran  # the gone client's input never ran
        metrics = httpx.get(running.url + "/metrics").text
        assert 'clearformer_requests_total{endpoint="embed",status="499"} 1.0' in metrics


def test_a_request_past_its_timeout_is_503_and_its_work_dropped(tiny, monkeypatch):
    config = ServeConfig(port=0, workers=1, request_timeout=0.2)
    with running_server(config, [ModelSpec(str(tiny))]) as running:
        gate = Gate(monkeypatch)
        late = post(running.url, "/embed", {"inputs": "a"})  # the gate outlasts its timeout
        assert late.status_code == 503, late.text
        assert "request_timeout" in late.json()["error"] and "retry-after" in late.headers
        assert running.state.in_flight == 0
        gate.open()


def test_metrics_count_requests_batches_and_tokens(server):
    post(server.url, "/embed", {"inputs": TEXTS})
    text = httpx.get(server.url + "/metrics").text
    for name in (
        "clearformer_requests_total",
        "clearformer_request_duration_seconds_bucket",
        "clearformer_queue_depth",
        "clearformer_queue_duration_seconds_count",
        "clearformer_batch_size_bucket",
        "clearformer_batch_tokens_sum",
        "clearformer_batch_duration_seconds_count",
        "clearformer_tokens_total",
        "clearformer_tokens_per_second",
        "clearformer_ready 1.0",
    ):
        assert name in text, name
    tokens = float(text.split("\nclearformer_tokens_total ")[1].split()[0])
    assert tokens >= 20  # TEXTS alone carry 22 tokens


@pytest.mark.parametrize("kind", ["distilbert", "modernbert", "xlm-roberta"])
def test_rerankers_of_every_family_load_and_score_as_predict(kind, tmp_path):
    pytest.importorskip("transformers")
    from .test_sequence_classification import make_classifier

    make_classifier(kind, tmp_path, num_labels=1)
    expected = CrossEncoder.from_pretrained(tmp_path).predict([("w1 w2", "w3"), ("w1 w2", "w4 w5")])
    config = ServeConfig(port=0, workers=1)
    with running_server(config, [ModelSpec(str(tmp_path), kind)]) as running:
        ranked = post(running.url, "/rerank", {"query": "w1 w2", "texts": ["w3", "w4 w5"]})
        info = httpx.get(running.url + "/info").json()
    scores = {r["index"]: np.float32(r["score"]) for r in ranked.json()}
    assert scores == dict(enumerate(expected))
    assert "reranker" in info["model_type"]


def test_prompt_names_apply_the_checkpoints_prompts_as_encode_does(tmp_path):
    path = write_tiny_bert(tmp_path / "prompted", WORDS)
    prompts = {"prompts": {"query": "dog dog ", "passage": ""}, "default_prompt_name": "passage"}
    (path / "config_sentence_transformers.json").write_text(json.dumps(prompts))
    encoder = TextEncoder.from_pretrained(path)
    config = ServeConfig(port=0, workers=1)
    with running_server(config, [ModelSpec(str(path), "prompted")]) as running:
        query = floats(post(running.url, "/embed", {"inputs": TEXTS, "prompt_name": "query"}))
        default = floats(post(running.url, "/embed", {"inputs": TEXTS}))
        tokens = post(running.url, "/tokenize", {"inputs": "cat", "prompt_name": "query"}).json()
        unknown = post(running.url, "/embed", {"inputs": "a", "prompt_name": "title"})
    np.testing.assert_array_equal(query, encoder.encode(TEXTS, prompt_name="query", normalize=True))
    np.testing.assert_array_equal(default, encoder.encode(TEXTS, normalize=True))
    assert not np.array_equal(query, default)
    assert [t["text"] for t in tokens[0]] == ["[CLS]", "dog", "dog", "cat", "[SEP]"]
    assert unknown.status_code == 422
    assert (
        "prompt_name must be one of the checkpoint's prompts ['passage', 'query']"
        in (unknown.json()["error"])
    )


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("max_batch_tokens", 0, "max_batch_tokens must be a positive int, got 0"),
        ("max_concurrent_requests", 1.5, "max_concurrent_requests must be a positive int"),
        ("request_timeout", 0, "request_timeout must be a float > 0, got 0"),
        ("port", 70000, "port must be an int in [0, 65536), got 70000"),
        (
            "precision",
            "int4",
            "precision must be one of ('float32', 'bf16', 'int8', 'int8-blocks', 'auto', "
            "'bfloat16'), got 'int4'",
        ),
    ],
)
def test_the_config_names_a_bad_setting(field, value, message):
    with pytest.raises((TypeError, ValueError), match=re.escape(message)):
        ServeConfig(**{field: value})


def test_the_cli_refuses_a_missing_model_before_listening(tmp_path, capsys):
    from clearformer.cli import main

    assert main(["serve", "--model", str(tmp_path / "none"), "--port", "0"]) == 2
    err = capsys.readouterr().err
    missing = tmp_path / "none"
    assert err == f"clearformer serve: error: --model: checkpoint directory not found: {missing}\n"


def test_int8_precision_serves_encodes_int8_rows(tiny):
    encoder = TextEncoder.from_pretrained(tiny)
    config = ServeConfig(port=0, workers=1, precision="int8")
    with running_server(config, [ModelSpec(str(tiny), "tiny")]) as running:
        rows = floats(post(running.url, "/embed", {"inputs": TEXTS}))
        dtype = httpx.get(running.url + "/info").json()["model_dtype"]
    np.testing.assert_array_equal(rows, encoder.encode(TEXTS, precision="int8", normalize=True))
    assert dtype == "int8"


def test_int8_blocks_precision_serves_its_rows_and_its_scores(tiny, reranker):
    from clearformer.quant.int8_blocks import block_kernel_support

    if block_kernel_support().choice != "available":
        pytest.skip(f"no int8-blocks kernel here: {block_kernel_support().reason}")
    encoder = TextEncoder.from_pretrained(tiny)
    ranker = CrossEncoder.from_pretrained(reranker)
    config = ServeConfig(port=0, workers=1, precision="int8-blocks")
    specs = [ModelSpec(str(tiny), "tiny"), ModelSpec(str(reranker), "ranker")]
    with running_server(config, specs) as running:
        rows = floats(post(running.url, "/embed", {"inputs": TEXTS, "model": "tiny"}))
        info = httpx.get(running.url + "/info").json()
        ranked = post(running.url, "/rerank", {"model": "ranker", "query": "w1", "texts": TEXTS})
    expected = encoder.encode(TEXTS, precision="int8-blocks", normalize=True)
    np.testing.assert_array_equal(rows, expected)
    assert np.abs(rows - encoder.encode(TEXTS, normalize=True)).max() > 0  # really rounded
    assert info["model_dtype"] == "int8-blocks"
    want = ranker.predict([("w1", t) for t in TEXTS], precision="int8-blocks")
    got = {item["index"]: item["score"] for item in ranked.json()}
    np.testing.assert_allclose([got[i] for i in range(len(TEXTS))], want, atol=1e-6, rtol=0)


def test_bf16_precision_serves_bf16_rows_and_scores(tiny, reranker):
    encoder = TextEncoder.from_pretrained(tiny)
    ranker = CrossEncoder.from_pretrained(reranker)
    config = ServeConfig(port=0, workers=1, precision="bfloat16")
    specs = [ModelSpec(str(tiny), "tiny"), ModelSpec(str(reranker), "ranker")]
    with running_server(config, specs) as running:
        rows = floats(post(running.url, "/embed", {"inputs": TEXTS}))
        info = httpx.get(running.url + "/info").json()
        ranked = post(running.url, "/rerank", {"model": "ranker", "query": "w1", "texts": TEXTS})
    np.testing.assert_array_equal(rows, encoder.encode(TEXTS, precision="bf16", normalize=True))
    assert np.abs(rows - encoder.encode(TEXTS, normalize=True)).max() > 0  # really bfloat16
    assert info["model_dtype"] == "bf16"
    want = ranker.predict([("w1", t) for t in TEXTS], precision="bf16")
    got = {item["index"]: item["score"] for item in ranked.json()}
    np.testing.assert_allclose([got[i] for i in range(len(TEXTS))], want, atol=1e-6, rtol=0)


def test_a_bf16_server_holds_each_model_in_bfloat16_alone(tiny, reranker):
    """``--precision bf16``: the embedding model and the reranker are loaded in bfloat16 alone
    (no float32 linear weight), and their answers are the bf16 ones of the library."""
    import torch

    from clearformer.serve.models import load_model

    embed = load_model(ModelSpec(str(tiny)), max_input_tokens=None, precision="bf16",
                       backend="auto")  # fmt: skip
    rank = load_model(ModelSpec(str(reranker)), max_input_tokens=None, precision="bf16",
                      backend="auto")  # fmt: skip
    for served in (embed, rank):
        linear = {m.weight.dtype for m in served.model.model.modules()
                  if isinstance(m, torch.nn.Linear)}  # fmt: skip
        assert served.precision == "bf16" and linear == {torch.bfloat16}, served.kind
    texts = ["a cat sits", "stock markets fell sharply on monday"]
    prepared = embed.prepare(texts, field="input", normalize=True, truncate=False)
    want = TextEncoder.from_pretrained(tiny).encode(texts, normalize=True, precision="bf16")
    assert np.array_equal(embed.run(prepared.encodings, prepared.options), want)
