"""``clearformer serve`` as a real process: on SIGTERM or SIGINT it stops accepting
connections, answers every request in flight (the one computing and the ones queued), and
exits 0; past ``--graceful-timeout`` it answers them 503 and exits 1.

The child's batches that carry the word "dog" wait for a line on its stdin, so the test
decides when requests in flight may finish: after the signal, and after the listener has
closed. No step depends on timing."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from .helpers import write_tiny_bert
from .test_serve_api import WAIT, WORDS, floats, post, wait_for

pytest.importorskip("uvicorn")
pytest.importorskip("starlette")
pytest.importorskip("prometheus_client")
httpx = pytest.importorskip("httpx")

DOG = WORDS.index("dog")  # its token id
CHILD = f"""
import sys, threading
from clearformer.serve.models import ServedModel

go = threading.Event()
threading.Thread(target=lambda: (sys.stdin.readline(), go.set()), daemon=True).start()
original = ServedModel.run

def run(self, encodings, options):
    if any({DOG} in e.ids for e in encodings):  # a test's request, not the warm-up
        print("batch", flush=True)
        go.wait()
    return original(self, encodings, options)

ServedModel.run = run
from clearformer.cli import main
sys.exit(main(["serve", "--model", sys.argv[1], "--port", "0", "--workers", "1", *sys.argv[2:]]))
"""


class Child:
    """The server process, its stderr read line by line on a thread; ``script`` is the Python
    that runs it (its argv: the model, then ``flags``), ``ready`` whether to wait for the
    models to be ready."""

    def __init__(self, model, *flags: str, script: str = CHILD, ready: bool = True) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", script, str(model), *flags],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"},
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        listening = self.wait_line("listening on ")
        self.url = listening.split("listening on ")[1].split()[0]
        self.port = int(self.url.rsplit(":", 1)[1])
        if ready:
            self.wait_line("ready in ")

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.put(line)

    def wait_line(self, fragment: str) -> str:
        while True:
            try:
                line = self.lines.get(timeout=WAIT)
            except queue.Empty:
                raise AssertionError(f"no {fragment!r} on stderr: {self.seen}") from None
            self.seen.append(line)
            if fragment in line:
                return line

    def in_flight(self) -> int:
        text = httpx.get(self.url + "/metrics", timeout=WAIT).text
        return int(float(text.split("\nclearformer_requests_in_flight ")[1].split()[0]))

    def release(self) -> None:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def refuses_connections(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=WAIT).close()
        except ConnectionRefusedError:
            return True
        return False

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(WAIT)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_bert(tmp_path_factory.mktemp("tiny-drain"), WORDS)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_drains_every_request_in_flight_then_exits_0(tiny, sig):
    child = Child(tiny)
    try:
        texts = [["dog", "a cat"], ["dog dog"], ["b", "dog c"]]
        with ThreadPoolExecutor(len(texts)) as pool:
            futures = [pool.submit(post, child.url, "/embed", {"inputs": t}) for t in texts]
            assert child.proc.stdout.readline() == "batch\n"  # one computing, held
            wait_for(lambda: child.in_flight() == 3, "three requests in flight")
            # A fourth, admitted with half its body sent: it is in flight too.
            body = json.dumps({"inputs": ["dog a"]}).encode()
            slow = socket.create_connection(("127.0.0.1", child.port))
            slow.sendall(
                b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body[:5]
            )
            wait_for(lambda: child.in_flight() == 4, "the fourth request admitted")
            child.proc.send_signal(sig)
            line = child.wait_line("draining")
            assert f"{signal.Signals(sig).name}: draining, 4 request(s) in flight" in line
            wait_for(child.refuses_connections, "the listener to close")
            slow.sendall(body[5:])  # the rest of its body, after the signal
            assert not any(f.done() for f in futures)  # none answered yet
            child.release()
            answers = [floats(f.result()) for f in futures]
            with slow.makefile("rb") as answer:
                assert answer.readline().startswith(b"HTTP/1.1 200")
            slow.close()
        assert [a.shape for a in answers] == [(2, 16), (1, 16), (2, 16)]
        assert child.proc.wait(WAIT) == 0
        child.wait_line("stopped: every request answered")
    finally:
        child.close()


def test_a_drain_past_its_bound_answers_503_and_exits_1(tiny):
    child = Child(tiny, "--graceful-timeout", "0.5")
    try:
        with ThreadPoolExecutor(1) as pool:
            stuck = pool.submit(post, child.url, "/embed", {"inputs": "dog"})
            assert child.proc.stdout.readline() == "batch\n"
            child.proc.send_signal(signal.SIGTERM)
            # Never released: the drain's bound ends it.
            assert child.proc.wait(WAIT) == 1
            cut = stuck.result()
            assert cut.status_code == 503 and cut.headers["retry-after"] == "1"
            assert "shut down before this request was finished" in cut.json()["error"]
        child.wait_line("stopped: 1 request(s) not finished within graceful_timeout")
    finally:
        child.close()


def test_a_second_signal_stops_at_once_without_a_traceback(tiny):
    child = Child(tiny)
    try:
        with ThreadPoolExecutor(1) as pool:
            stuck = pool.submit(post, child.url, "/embed", {"inputs": "dog"})
            assert child.proc.stdout.readline() == "batch\n"
            child.proc.send_signal(signal.SIGTERM)
            child.wait_line("SIGTERM: draining, 1 request(s) in flight")
            child.proc.send_signal(signal.SIGTERM)  # never released: only the second stops it
            child.proc.wait(WAIT)
            with contextlib.suppress(httpx.HTTPError):
                stuck.result()  # cut off, however the connection ended
        child.wait_line("SIGTERM again: stopping without waiting")
        with contextlib.suppress(queue.Empty):
            while True:  # the rest of stderr, to its end
                child.seen.append(child.lines.get(timeout=2))
        assert "Traceback" not in "".join(child.seen)
    finally:
        child.close()
