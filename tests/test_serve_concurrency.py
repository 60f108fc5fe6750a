"""64 concurrent clients of a ``clearformer serve`` process, each with its own texts, get
exactly their own embeddings: each request's rows equal ``TextEncoder.encode`` of that
request's texts alone, to the bit, and every request is answered once, its inputs computed
once (the server's ``/metrics`` counts, before and after).

The clients' requests are queued behind a gate, then released together, so that each of the
batch workers' forward passes mixes the inputs of several requests (and a small token budget
spreads a request over batches): no step depends on timing."""

from __future__ import annotations

import os
import queue
import random
import re
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from .helpers import intra_op_threads, write_tiny_bert
from .test_serve_api import WAIT, floats, post, wait_for

pytest.importorskip("uvicorn")
pytest.importorskip("starlette")
pytest.importorskip("prometheus_client")
httpx = pytest.importorskip("httpx")

from clearformer.text import TextEncoder  # noqa: E402

GATE = "gate"  # the word whose batch closes the gate (no client text carries it)
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", GATE] + [f"w{i}" for i in range(80)]
CLIENTS = 64
BATCH_TOKENS = 256  # small: a request's inputs are spread over several batches
EMBED_OK = '{endpoint="embed",status="200"}'  # the requests counter's labels: a 200 of a route
OPENAI_OK = '{endpoint="embeddings",status="200"}'

# The server, with every batch from the gate's on held until a line arrives on its stdin
# (before that: the warm-up). Each held batch prints its size, so the test knows how many
# inputs the workers took before the gate opened.
CHILD = f"""
import sys, threading
import torch
torch.set_num_threads(2)  # two workers of one thread each, and 2 for a lone request
from clearformer.serve.models import ServedModel

go, gated = threading.Event(), threading.Event()
threading.Thread(target=lambda: (sys.stdin.readline(), go.set()), daemon=True).start()
original = ServedModel.run
gate_id = {WORDS.index(GATE)}

def run(self, encodings, options):
    if any(gate_id in e.ids for e in encodings):
        gated.set()
    if gated.is_set() and not go.is_set():
        print("held", len(encodings), flush=True)
        go.wait()
    return original(self, encodings, options)

ServedModel.run = run
from clearformer.cli import main
sys.exit(main(["serve", "--model", sys.argv[1], "--port", "0", "--workers", "2",
               "--max-batch-tokens", "{BATCH_TOKENS}"]))
"""


class Server:
    """The server process; its stdout and stderr read line by line on threads."""

    def __init__(self, model) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(model)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"},
        )
        self.errors: queue.Queue[str] = queue.Queue()
        self.held: queue.Queue[int] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read_errors, daemon=True).start()
        threading.Thread(target=self._read_held, daemon=True).start()
        self.url = self._wait_line("listening on ").split("listening on ")[1].split()[0]
        self._wait_line("ready in ")

    def _read_errors(self) -> None:
        for line in self.proc.stderr:
            self.errors.put(line)

    def _read_held(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("held "):
                self.held.put(int(line.split()[1]))

    def _wait_line(self, fragment: str) -> str:
        while True:
            try:
                line = self.errors.get(timeout=WAIT)
            except queue.Empty:
                raise AssertionError(f"no {fragment!r} on stderr: {self.seen}") from None
            self.seen.append(line)
            if fragment in line:
                return line

    def metric(self, name: str, labels: str = "") -> float:
        """One sample of ``/metrics`` (0 when the series has no sample yet)."""
        text = httpx.get(self.url + "/metrics", timeout=WAIT).text
        found = re.search(rf"^{re.escape(name + labels)} (\S+)$", text, re.MULTILINE)
        return float(found.group(1)) if found else 0.0

    def open_gate(self) -> None:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(WAIT)


def client_texts(clients: int) -> list[list[str]]:
    """Each client's two to eight texts of 1 to 25 words, ragged within a request and between
    requests; no text twice. The first client's texts are equally long (its ``encode`` has no
    padding) and the second's nearly so (a few per cent of padding), the batches the server's
    mixed ones are least like."""
    rng = random.Random(0)
    seen: set[str] = set()
    requests = []
    for client in range(clients):
        lengths = [rng.randint(1, 25) for _ in range(rng.randint(2, 8))]
        if client == 0:
            lengths = [12] * 5
        elif client == 1:
            lengths = [20, 20, 21]  # 2 padded positions of 69
        texts: list[str] = []
        for length in lengths:
            text = ""
            while not text or text in seen:
                text = " ".join(f"w{rng.randrange(80)}" for _ in range(length))
            seen.add(text)
            texts.append(text)
        requests.append(texts)
    return requests


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_bert(tmp_path_factory.mktemp("tiny-concurrent"), WORDS, n_layers=2)


def test_64_concurrent_clients_each_get_their_own_rows_once(tiny):
    requests = client_texts(CLIENTS)
    every = [text for texts in requests for text in texts]
    encoder = TextEncoder.from_pretrained(tiny)
    # Half the clients use TEI's /embed (normalised by default), half OpenAI's route (as the
    # checkpoint says: this one does not normalise).
    routes = ["/embed" if i % 2 == 0 else "/v1/embeddings" for i in range(CLIENTS)]
    # At one thread, as each of the server's two workers runs a batch of several requests,
    # and at two (the server's every thread), as a batch of one request's inputs alone runs:
    # PyTorch's attention kernel may round otherwise at another thread count for heads as
    # narrow as these (8). Each row must equal one of the two to the bit.
    with intra_op_threads(1):
        expected = [
            encoder.encode(texts, normalize=route == "/embed")
            for texts, route in zip(requests, routes, strict=True)
        ]
    with intra_op_threads(2):
        expected_wide = [
            encoder.encode(texts, normalize=route == "/embed", workers=1)
            for texts, route in zip(requests, routes, strict=True)
        ]
    rows = np.concatenate(expected)
    # Negative control: no two texts share a row, so a row sent to the wrong client (or to the
    # wrong place in a request) cannot pass for the right one.
    assert len(np.unique(rows.round(4), axis=0)) == len(rows)
    tokens = sum(len(e.ids) for e in encoder.tokenizer.encode(every))

    server = Server(tiny)
    try:
        before = {
            "embed": server.metric("clearformer_requests_total", EMBED_OK),
            "openai": server.metric("clearformer_requests_total", OPENAI_OK),
            "tokens": server.metric("clearformer_tokens_total"),
            "inputs": server.metric("clearformer_batch_size_sum"),
            "batches": server.metric("clearformer_batch_size_count"),
            "small": server.metric("clearformer_batch_size_bucket", '{le="8.0"}'),
        }
        start = threading.Barrier(CLIENTS)

        def ask(i: int) -> np.ndarray:
            start.wait(WAIT)  # every client sends at once
            if routes[i] == "/embed":
                return floats(post(server.url, "/embed", {"inputs": requests[i]}))
            answer = post(server.url, "/v1/embeddings", {"input": requests[i]})
            assert answer.status_code == 200, answer.text
            data = answer.json()["data"]
            assert [d["index"] for d in data] == list(range(len(requests[i])))
            return np.float32([d["embedding"] for d in data])

        with ThreadPoolExecutor(CLIENTS + 1) as pool:
            gate = pool.submit(post, server.url, "/embed", {"inputs": GATE})
            assert server.held.get(timeout=WAIT) == 1  # the gate's batch: the gate is closed
            futures = [pool.submit(ask, i) for i in range(CLIENTS)]
            wait_for(
                lambda: server.metric("clearformer_requests_in_flight") == CLIENTS + 1,
                "every request admitted",
            )
            # Each input is queued or in a batch a worker took (and holds).
            taken = 0

            def all_queued() -> bool:
                nonlocal taken
                while not server.held.empty():
                    taken += server.held.get()
                return server.metric("clearformer_queue_depth") + taken == len(every)

            wait_for(all_queued, "every input queued or in a held batch")
            server.open_gate()
            answers = [f.result() for f in futures]
            assert gate.result().status_code == 200
        after = {
            "embed": server.metric("clearformer_requests_total", EMBED_OK),
            "openai": server.metric("clearformer_requests_total", OPENAI_OK),
            "tokens": server.metric("clearformer_tokens_total"),
            "inputs": server.metric("clearformer_batch_size_sum"),
            "batches": server.metric("clearformer_batch_size_count"),
            "small": server.metric("clearformer_batch_size_bucket", '{le="8.0"}'),
        }
    finally:
        server.close()

    for i, (answer, alone, wide) in enumerate(zip(answers, expected, expected_wide, strict=True)):
        assert answer.shape == alone.shape, f"client {i}"
        for r, row in enumerate(answer):
            assert (row == alone[r]).all() or (row == wide[r]).all(), (
                f"client {i} ({routes[i]}) row {r}: {row} is neither {alone[r]} nor {wide[r]}"
            )
    # Answered once each (the gate's request too), every input computed exactly once.
    assert after["embed"] - before["embed"] == CLIENTS // 2 + 1  # with the gate's
    assert after["openai"] - before["openai"] == CLIENTS // 2
    assert after["tokens"] - before["tokens"] == tokens + 3  # the gate's: [CLS] gate [SEP]
    assert after["inputs"] - before["inputs"] == len(every) + 1
    # Batches were shared: inputs of at most 27 tokens fill a 256-token budget with 9 or more,
    # and no request has more than 8.
    batches = after["batches"] - before["batches"]
    assert batches > 2 and after["small"] - before["small"] < batches
