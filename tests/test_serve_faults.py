"""Every way a request to ``clearformer serve`` can fail, on a real server process: each is
answered as docs/serving.md says (4xx, 499 or 503, never a 500) and counted so in ``/metrics``
(``clearformer_requests_total``'s ``status`` label), the server logs no traceback, and a
forced stop exits 1.

The faults are classes, each a table of its cases sent to one server: malformed bodies of
every kind, sizes, bad fields, the key, routes, slow bodies, clients gone. Each case must add
exactly one count, of its endpoint and status, and nothing else. Then the faults that need
several requests or a process of their own: slow clients on every slot, work past
``--request-timeout``, overload, and the forced stops.

The server's ``request_timeout`` is short (2 s). Its batches whose inputs carry "dog" are held
until a line on its stdin releases one, and they wait inside torch's native code, as a forward
pass does (which is what a forced stop meets): steps are ordered by that gate, not by timing.
"""

from __future__ import annotations

import contextlib
import json
import queue
import re
import signal
import socket
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from .helpers import write_tiny_bert
from .test_serve_api import WAIT, WORDS, wait_for
from .test_serve_drain import Child

pytest.importorskip("uvicorn")
pytest.importorskip("starlette")
pytest.importorskip("prometheus_client")
httpx = pytest.importorskip("httpx")

DOG = WORDS.index("dog")  # its token id
KEY = "fault-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
TIMEOUT = 2.0  # the server's --request-timeout
LIMIT = 10_000  # its --payload-limit
SLOTS = 2  # its --max-concurrent-requests
FLAGS = (
    *("--api-key", KEY, "--request-timeout", str(TIMEOUT), "--payload-limit", str(LIMIT)),
    *("--max-concurrent-requests", str(SLOTS), "--max-client-batch-size", "4"),
)

# The server, with each batch carrying "dog" held until a line arrives on its stdin: held in
# torch operations (native code, the GIL released and taken back at each), as a forward pass.
HELD = f"""
import sys, threading, torch
from clearformer.serve.models import ServedModel

released = threading.Semaphore(0)
threading.Thread(target=lambda: [released.release() for _ in sys.stdin], daemon=True).start()

def hold():
    x = torch.ones(32, 32)
    while not released.acquire(blocking=False):
        x @ x

original = ServedModel.run

def run(self, encodings, options):
    if any({DOG} in e.ids for e in encodings):  # a test's request, not the warm-up
        print("batch", flush=True)
        hold()
    return original(self, encodings, options)

ServedModel.run = run
original_tokenize = ServedModel.tokenize

def tokenize(self, texts, **options):
    if any("dog" in text for text in texts):
        print("tokenize", flush=True)
        hold()
    return original_tokenize(self, texts, **options)

ServedModel.tokenize = tokenize
if "--hold-loading" in sys.argv:  # the models' loading held the same way
    sys.argv.remove("--hold-loading")
    from clearformer.serve.state import ServerState

    def calibrate(self):
        print("loading", flush=True)
        hold()

    ServerState._calibrate = calibrate
from clearformer.cli import main
sys.exit(main(["serve", "--model", sys.argv[1], "--port", "0", "--workers", "1", *sys.argv[2:]]))
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_bert(tmp_path_factory.mktemp("tiny-faults"), WORDS)


@pytest.fixture(scope="module")
def server(tiny):
    child = Child(tiny, *FLAGS, script=HELD)
    try:
        yield child
    finally:
        child.close()


# Talking to it ------------------------------------------------------------------------


def counts(child: Child) -> Counter:
    """``clearformer_requests_total`` by (endpoint, status), less the scrapes themselves."""
    text = httpx.get(child.url + "/metrics", headers=AUTH, timeout=WAIT).text
    pattern = r'^clearformer_requests_total\{endpoint="(\w+)",status="(\d+)"\} (\S+)$'
    found = Counter()
    for endpoint, status, value in re.findall(pattern, text, re.MULTILINE):
        if endpoint != "metrics":
            found[endpoint, int(status)] = int(float(value))
    return found


def added(child: Child, before: Counter) -> Counter:
    after = counts(child)
    after.subtract(before)
    return +after  # the counts that grew


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def error(self) -> str:
        payload = json.loads(self.body)
        error = payload["error"]
        return error["message"] if isinstance(error, dict) else error


def raw(child: Child, head: str, body: bytes = b"", *, close: bool = False) -> Answer | None:
    """Send ``head`` (the request line and headers, without the blank line) and ``body`` on a
    connection of its own, which the server closes after its answer; read the answer.
    ``close``: disconnect instead, without reading (None)."""
    sock = socket.create_connection(("127.0.0.1", child.port), timeout=WAIT)
    with sock:
        sock.sendall(f"{head}\r\nHost: x\r\nConnection: close\r\n\r\n".encode() + body)
        if close:
            return None
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    top, _, content = data.partition(b"\r\n\r\n")
    lines = top.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return Answer(int(lines[0].split()[1]), headers, content)


def post(child: Child, path: str, content: bytes, *, key: bool = True) -> Answer:
    headers = {"Content-Type": "application/json", **(AUTH if key else {})}
    answer = httpx.post(child.url + path, content=content, headers=headers, timeout=WAIT)
    return Answer(answer.status_code, dict(answer.headers), answer.content)


def embed(child: Child, texts) -> Answer:
    return post(child, "/embed", json.dumps({"inputs": texts}).encode())


def rest_of_stderr(child: Child) -> str:
    """Everything the server wrote on stderr, to its end (once it has exited)."""
    with contextlib.suppress(queue.Empty):
        while True:
            child.seen.append(child.lines.get(timeout=0.5))
    return "".join(child.seen)


# The faults of one request, by class ----------------------------------------------------


@dataclass
class Fault:
    send: Callable[[Child], Answer | None]  # None: the client left without an answer
    endpoint: str  # the label it is counted under
    status: int
    says: str = ""  # in the error message


def body(path: str, content: bytes, endpoint: str, status: int, says: str = "") -> Fault:
    return Fault(lambda child: post(child, path, content), endpoint, status, says)


def fields(payload, status: int, says: str, path: str = "/embed", endpoint: str = "embed"):
    return body(path, json.dumps(payload).encode(), endpoint, status, says)


DEEP = 2_000  # levels of nesting: past Python's recursion limit, within the payload limit
MALFORMED = {
    "not JSON": body("/embed", b"{", "embed", 400, "not valid JSON"),
    "empty": body("/embed", b"", "embed", 400, "not valid JSON"),
    "data after the value": body("/embed", b'{"inputs": "a"} x', "embed", 400, "not valid JSON"),
    "not UTF-8": body("/embed", b'{"inputs": "\xff\xfe"}', "embed", 400, "it is not UTF-8"),
    # json.loads alone would guess these encodings from the first bytes, and read them.
    "UTF-16": body("/embed", '{"inputs": "a"}'.encode("utf-16"), "embed", 400, "not UTF-8"),
    "UTF-16 without a BOM": body(
        "/embed", '{"inputs": "a"}'.encode("utf-16-le"), "embed", 400, "not valid JSON"
    ),
    "UTF-32": body("/embed", '{"inputs": "a"}'.encode("utf-32"), "embed", 400, "not valid JSON"),
    # Python's json reads these; JSON has no such values.
    "NaN": body("/embed", b'{"inputs": "a", "dimensions": NaN}', "embed", 400, "NaN is not"),
    "Infinity": body("/rerank", b'{"query": "a", "texts": ["b"], "x": Infinity}', "rerank", 400),
    "-Infinity": body("/tokenize", b'{"inputs": "a", "x": [-Infinity]}', "tokenize", 400),
    "a number of 5,000 digits": body(
        "/embed", b'{"inputs": "a", "dimensions": ' + b"9" * 5_000 + b"}", "embed", 400
    ),
    "arrays nested, unclosed": body("/embed", b"[" * DEEP, "embed", 400, "nest too deeply"),
    "arrays nested, closed": body(
        "/embed", b"[" * DEEP + b"]" * DEEP, "embed", 400, "nest too deeply"
    ),
    "objects nested": body("/embed", b'{"a":' * DEEP, "embed", 400, "nest too deeply"),
    "nested in a field": body(
        "/embed", b'{"inputs": ' + b"[" * DEEP + b"]" * DEEP + b"}", "embed", 400
    ),
    "nested, OpenAI's route": body(
        "/v1/embeddings", b"[" * DEEP, "embeddings", 400, "nest too deeply"
    ),
    "nested, /rerank": body("/rerank", b"[" * DEEP, "rerank", 400, "nest too deeply"),
    "nested, /tokenize": body("/tokenize", b"[" * DEEP, "tokenize", 400, "nest too deeply"),
}
SIZES = {
    "a body over the limit": body("/embed", b" " * (LIMIT + 1), "embed", 413, "payload_limit"),
    "a chunked body over the limit": Fault(
        lambda child: raw(
            child,
            f"POST /embed HTTP/1.1\r\nTransfer-Encoding: chunked\r\nAuthorization: Bearer {KEY}",
            f"{LIMIT + 1:x}\r\n".encode() + b" " * (LIMIT + 1) + b"\r\n0\r\n\r\n",
        ),
        "embed",
        413,
        "more than",
    ),
    "too many inputs": fields({"inputs": ["a"] * 5}, 413, "over the limit of 4"),
    "an input over the token limit": fields({"inputs": "a " * 40}, 413, "tokens"),
}
FIELDS = {
    "inputs a number": fields({"inputs": 3}, 422, "inputs must be a string"),
    "inputs empty": fields({"inputs": []}, 400, "must not be empty"),
    "an input null": fields({"inputs": ["a", None]}, 422, "inputs[1] must be a string"),
    "a lone surrogate": body("/embed", b'{"inputs": "\\ud800"}', "embed", 422, "U+D800"),
    "a body that is a list": fields([1, 2], 422, "must be a JSON object"),
    "normalize a string": fields({"inputs": "a", "normalize": "yes"}, 422, "true or false"),
    "dimensions too wide": fields({"inputs": "a", "dimensions": 17}, 422, "width of 16"),
    "dimensions of 4,000 digits": fields(
        {"inputs": "a", "dimensions": 10**3_999}, 422, "width of 16, got an integer of 4,000 digits"
    ),
    "a direction nested deep": fields(
        {"inputs": "a", "truncation_direction": [[[[[]]]]]}, 422, "got a list"
    ),
    "an unknown model": fields({"inputs": "a", "model": "nope"}, 404, "not served"),
    "token ids on OpenAI's route": fields(
        {"input": [[1, 2]]}, 422, "token-id arrays", "/v1/embeddings", "embeddings"
    ),
    "an unknown encoding_format": fields(
        {"input": "a", "encoding_format": "hex"},
        422,
        "encoding_format",
        "/v1/embeddings",
        "embeddings",
    ),
    "/rerank with no cross-encoder served": fields(
        {"query": "a", "texts": ["b"]}, 422, "--model DIR", "/rerank", "rerank"
    ),
    "/tokenize, a field": fields({"inputs": 3}, 422, "inputs must be", "/tokenize", "tokenize"),
}
ACCESS = {
    "no key": Fault(
        lambda child: post(child, "/embed", b'{"inputs": "a"}', key=False), "embed", 401
    ),
    "a wrong key": Fault(
        lambda child: raw(
            child,
            "POST /embed HTTP/1.1\r\nAuthorization: Bearer nope\r\nContent-Length: 2",
            b"{}",
        ),
        "embed",
        401,
    ),
    "an unknown route": Fault(
        lambda child: raw(child, f"GET /nope HTTP/1.1\r\nAuthorization: Bearer {KEY}"),
        "unknown",
        404,
        "no route /nope",
    ),
    "a wrong method": Fault(
        lambda child: raw(child, f"GET /embed HTTP/1.1\r\nAuthorization: Bearer {KEY}"),
        "unknown",
        405,
        "not allowed",
    ),
}


def slow_body(path: str, endpoint: str) -> Fault:
    """Headers announcing 9,000 bytes, then one: the body never comes."""

    def send(child: Child) -> Answer:
        head = (
            f"POST {path} HTTP/1.1\r\nAuthorization: Bearer {KEY}\r\n"
            "Content-Type: application/json\r\nContent-Length: 9000"
        )
        return raw(child, head, b"{")

    return Fault(send, endpoint, 503, "request_timeout")


def gone_mid_body(path: str, endpoint: str) -> Fault:
    def send(child: Child) -> None:
        head = f"POST {path} HTTP/1.1\r\nAuthorization: Bearer {KEY}\r\nContent-Length: 100"
        raw(child, head, b'{"inputs": ', close=True)

    return Fault(send, endpoint, 499)


CLIENTS = {
    "a body too slow": slow_body("/embed", "embed"),
    "a body too slow, /tokenize": slow_body("/tokenize", "tokenize"),
    "gone mid-body": gone_mid_body("/embed", "embed"),
    "gone mid-body, OpenAI's route": gone_mid_body("/v1/embeddings", "embeddings"),
}
FAULTS = {**MALFORMED, **SIZES, **FIELDS, **ACCESS, **CLIENTS}


@pytest.mark.parametrize("fault", FAULTS.values(), ids=FAULTS.keys())
def test_each_fault_is_answered_as_documented_and_counted_so(server, fault):
    before = counts(server)
    answer = fault.send(server)
    if answer is None:  # nobody reads it: the metrics have the count once the server noticed
        wait_for(lambda: added(server, before), "the answer's count")
    else:
        assert answer.status == fault.status, answer.body
        assert fault.says in answer.error()
    assert added(server, before) == Counter({(fault.endpoint, fault.status): 1})


def test_a_slow_body_that_comes_whole_within_request_timeout_is_served(server):
    """A body that arrives, slowly but whole, within request_timeout is served."""
    payload = json.dumps({"inputs": "a b c"}).encode()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=WAIT)
    with sock:
        sock.sendall(
            f"POST /embed HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n".encode()
        )
        for i in range(0, len(payload), 4):
            sock.sendall(payload[i : i + 4])
            time.sleep(0.05)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")


def test_no_fault_logged_a_traceback_or_left_a_request_in_flight(server):
    text = httpx.get(server.url + "/metrics", headers=AUTH, timeout=WAIT).text
    assert "\nclearformer_requests_in_flight 0.0" in text
    assert not [key for key in counts(server) if key[1] >= 500 and key[1] != 503]
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(WAIT) == 0
    stderr = rest_of_stderr(server)
    assert "Traceback" not in stderr, stderr


# Faults of several requests --------------------------------------------------------------


@pytest.fixture
def fresh(tiny):
    """A server of its own, for a test that fills its slots."""
    child = Child(tiny, *FLAGS, script=HELD)
    try:
        yield child
    finally:
        child.close()


def test_slow_bodies_on_every_slot_are_503_at_request_timeout_and_free_them(fresh):
    """The slots are taken before the bodies are read: clients that never finish theirs
    would keep every other client at 429 without a bound on the body's time."""
    before = counts(fresh)
    with ThreadPoolExecutor(SLOTS) as pool:
        slow = [pool.submit(slow_body("/embed", "embed").send, fresh) for _ in range(SLOTS)]
        wait_for(lambda: in_flight(fresh) == SLOTS, "every slot taken by a slow body")
        assert embed(fresh, "a").status == 429
        answers = [future.result() for future in slow]
    assert [a.status for a in answers] == [503] * SLOTS
    assert "the body did not arrive within 2 s (request_timeout): 1 of 9,000 bytes came" in (
        answers[0].error()
    )
    assert embed(fresh, "a").status == 200  # the slots are free
    assert added(fresh, before) == Counter(
        {("embed", 503): SLOTS, ("embed", 429): 1, ("embed", 200): 1}
    )


def test_work_past_request_timeout_is_503_and_overload_429(fresh):
    before = counts(fresh)
    with ThreadPoolExecutor(SLOTS) as pool:
        held = [pool.submit(embed, fresh, f"dog {w}") for w in ("a", "b")]
        assert fresh.proc.stdout.readline() == "batch\n"  # the first held, the second queued
        wait_for(lambda: in_flight(fresh) == SLOTS, "every slot taken")
        refused = embed(fresh, "a")
        assert refused.status == 429 and int(refused.headers["retry-after"]) >= 1
        answers = [future.result() for future in held]  # request_timeout passes
    assert [a.status for a in answers] == [503, 503]
    assert all("request_timeout" in a.error() for a in answers)
    fresh.release()  # the held batch ends, its rows unused; the queued input was dropped
    assert embed(fresh, "a").status == 200
    assert added(fresh, before) == Counter(
        {("embed", 503): 2, ("embed", 429): 1, ("embed", 200): 1}
    )


def test_a_client_gone_during_tokenize_is_499_and_frees_its_slot(fresh):
    """/tokenize works on a thread of its own: its client's going is noticed while it works
    (counted 499, the slot freed), not once an answer nobody reads is written (counted 200)."""
    before = counts(fresh)
    body = json.dumps({"inputs": "the dog"}).encode()
    head = f"POST /tokenize HTTP/1.1\r\nAuthorization: Bearer {KEY}\r\nContent-Length: {len(body)}"
    raw(fresh, head, body, close=True)
    assert fresh.proc.stdout.readline() == "tokenize\n"  # its work is held
    wait_for(lambda: added(fresh, before) == Counter({("tokenize", 499): 1}), "a 499 counted")
    assert in_flight(fresh) == 0
    fresh.release()
    answer = post(fresh, "/tokenize", json.dumps({"inputs": "a b"}).encode())
    assert answer.status == 200
    assert added(fresh, before) == Counter({("tokenize", 499): 1, ("tokenize", 200): 1})


def in_flight(child: Child) -> int:
    text = httpx.get(child.url + "/metrics", headers=AUTH, timeout=WAIT).text
    return int(float(text.split("\nclearformer_requests_in_flight ")[1].split()[0]))


# Forced stops ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("signals", "flags", "says"),
    [
        ((signal.SIGTERM,), ("--graceful-timeout", "0.5"), "not finished within graceful_timeout"),
        ((signal.SIGTERM, signal.SIGINT), (), "stopped at once: 1 request(s) not finished"),
        ((signal.SIGINT, signal.SIGINT), (), "stopped at once: 1 request(s) not finished"),
    ],
    ids=["past-graceful-timeout", "SIGTERM-then-SIGINT", "SIGINT-twice"],
)
def test_a_forced_stop_answers_503_and_exits_1_with_a_batch_still_computing(
    tiny, signals, flags, says
):
    # request_timeout past the test's length: the stop, not the timeout, ends the request.
    child = Child(tiny, *FLAGS, "--request-timeout", "60", *flags, script=HELD)
    try:
        with ThreadPoolExecutor(1) as pool:
            stuck = pool.submit(embed, child, "dog")
            assert child.proc.stdout.readline() == "batch\n"  # held in native code, never let go
            child.proc.send_signal(signals[0])
            child.wait_line("draining, 1 request(s) in flight")
            for sig in signals[1:]:
                child.proc.send_signal(sig)
            status = child.proc.wait(WAIT)
            cut = stuck.result()
        assert cut.status == 503 and cut.headers["retry-after"] == "1"
        assert "shut down before this request was finished" in cut.error()
        stderr = rest_of_stderr(child)
        assert status == 1, (
            stderr
        )  # not -6: SIGABRT, "terminate called without an active exception"
        assert says in stderr
        assert "terminate called" not in stderr and "Traceback" not in stderr
    finally:
        child.close()


def test_a_stop_while_the_models_load_exits_0(tiny):
    child = Child(tiny, *FLAGS, "--hold-loading", script=HELD, ready=False)
    try:
        assert child.proc.stdout.readline() == "loading\n"  # in native code, never let go
        answer = embed(child, "a")
        assert answer.status == 503 and "loading" in answer.error()
        child.proc.send_signal(signal.SIGTERM)
        status = child.proc.wait(WAIT)
        stderr = rest_of_stderr(child)
        assert status == 0, stderr
        assert "stopped: every request answered" in stderr and "terminate called" not in stderr
    finally:
        child.close()
