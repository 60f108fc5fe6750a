"""Tokenizing a request runs off the event loop: while one request's texts are being tokenized
(seconds, for a body near the size limit), the server answers others, /health included;
/tokenize takes a concurrency slot as the other routes that compute do, writes its answer on
the worker thread, and is bound by request_timeout as they are."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time

import pytest

pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from clearformer.serve import ModelSpec, ServeConfig  # noqa: E402
from clearformer.serve.models import ServedModel  # noqa: E402

from .helpers import write_tiny_bert  # noqa: E402
from .index_helpers import WORDS  # noqa: E402
from .test_serve_api import WAIT, running_server  # noqa: E402

HOLD = 10.0  # seconds a held tokenization waits at most (the test opens it sooner)


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


def test_tokenize_is_503_at_request_timeout_while_its_work_still_runs(tiny, monkeypatch):
    entered, release, finished = threading.Event(), threading.Event(), threading.Event()
    original = ServedModel.tokenize

    def held_tokenize(model, *args, **kwargs):
        entered.set()
        try:
            release.wait(HOLD)  # stands for a long tokenization; the test opens it
            return original(model, *args, **kwargs)
        finally:
            finished.set()

    config = ServeConfig(port=0, workers=1, request_timeout=0.5)
    with running_server(config, [ModelSpec(str(tiny), "tiny")]) as running:
        monkeypatch.setattr(ServedModel, "tokenize", held_tokenize)
        try:
            late = httpx.post(running.url + "/tokenize", json={"inputs": "w1"}, timeout=WAIT)
            assert entered.is_set() and not finished.is_set()  # answered before it ended
        finally:
            release.set()
        assert late.status_code == 503, late.text
        assert "request_timeout" in late.json()["error"] and "retry-after" in late.headers
        assert running.state.in_flight == 0  # its slot is free
        metrics = httpx.get(running.url + "/metrics", timeout=WAIT).text
        assert 'clearformer_requests_total{endpoint="tokenize",status="503"} 1.0' in metrics


def test_tokenize_writes_its_answer_on_the_worker_thread(tiny, monkeypatch):
    written = []
    original = ServedModel.tokenize

    def spied_tokenize(model, *args, **kwargs):
        body = original(model, *args, **kwargs)
        with contextlib.suppress(RuntimeError):  # no event loop in this thread: as it must be
            asyncio.get_running_loop()
            written.append("on the event loop")
        written.append(body)
        return body

    config = ServeConfig(port=0, workers=1)
    with running_server(config, [ModelSpec(str(tiny), "tiny")]) as running:
        monkeypatch.setattr(ServedModel, "tokenize", spied_tokenize)
        answer = httpx.post(running.url + "/tokenize", json={"inputs": ["w1 w2", ""]}, timeout=WAIT)
    assert answer.status_code == 200
    assert written == [answer.content]  # the bytes the thread wrote, sent as they are
    assert [[t["text"] for t in row] for row in answer.json()] == [
        ["[CLS]", "w1", "w2", "[SEP]"],
        ["[CLS]", "[SEP]"],
    ]


def test_tokenize_stops_its_work_past_the_deadline(tiny):
    from clearformer.serve.models import load_model

    spec = ModelSpec(str(tiny))
    served = load_model(spec, max_input_tokens=None, precision="float32", backend="auto")
    with pytest.raises(TimeoutError):
        served.tokenize(
            ["w1 w2"], add_special_tokens=True, prompt_name=None, deadline=time.monotonic() - 1
        )
    whole = served.tokenize(["w1 w2"], add_special_tokens=True, prompt_name=None, deadline=None)
    assert [t["text"] for t in json.loads(whole)[0]] == ["[CLS]", "w1", "w2", "[SEP]"]
