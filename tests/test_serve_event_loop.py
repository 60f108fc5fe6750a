"""Tokenizing a request runs off the event loop: while one request's texts are being tokenized
(seconds, for a body near the size limit), the server answers others, /health included; and
/tokenize takes a concurrency slot as the other routes that compute do."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from clearformer.serve import ModelSpec, ServeConfig  # noqa: E402
from clearformer.serve.models import ServedModel  # noqa: E402

from .helpers import write_tiny_bert  # noqa: E402
from .index_helpers import WORDS  # noqa: E402
from .test_serve_api import WAIT, running_server  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_bert(tmp_path_factory.mktemp("tiny-loop"), WORDS)


def test_the_server_answers_while_a_request_is_tokenized(tiny, monkeypatch):
    entered, release = threading.Event(), threading.Event()
    original = ServedModel.prepare

    def slow_prepare(model, *args, **kwargs):
        entered.set()
        release.wait(WAIT)  # stands for a long tokenization; the test opens it
        return original(model, *args, **kwargs)

    config = ServeConfig(port=0, workers=1)
    with running_server(config, [ModelSpec(str(tiny), "tiny")]) as running:
        monkeypatch.setattr(ServedModel, "prepare", slow_prepare)
        answers = {}

        def embed() -> None:
            body = {"inputs": ["w1 w2 w3"]}
            answers["embed"] = httpx.post(running.url + "/embed", json=body, timeout=WAIT)

        thread = threading.Thread(target=embed)
        thread.start()
        try:
            assert entered.wait(WAIT), "the request never reached its tokenization"
            # On the event loop the tokenization would hold this answer until it ended.
            health = httpx.get(running.url + "/health", timeout=10)
            assert health.status_code == 200
            assert not release.is_set()  # answered while the other request was tokenized
        finally:
            release.set()
            thread.join(WAIT)
        assert answers["embed"].status_code == 200


def test_tokenize_takes_a_concurrency_slot(tiny):
    config = ServeConfig(port=0, workers=1, max_concurrent_requests=1)
    with running_server(config, [ModelSpec(str(tiny), "tiny")]) as running:
        running.state.admit()  # every slot taken
        try:
            busy = httpx.post(running.url + "/tokenize", json={"inputs": "w1"}, timeout=WAIT)
        finally:
            running.state.release()
        assert busy.status_code == 429 and "Retry-After" in busy.headers
        free = httpx.post(running.url + "/tokenize", json={"inputs": "w1"}, timeout=WAIT)
        assert free.status_code == 200
