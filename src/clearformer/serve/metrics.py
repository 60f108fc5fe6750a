"""The server's Prometheus metrics, in a registry of its own (``GET /metrics``).

One registry per server, not prometheus_client's process-wide default, so that two servers in
one process (tests, an embedding application) count apart. Every name starts ``clearformer_``:

* ``requests_total{endpoint, status}``, ``request_duration_seconds{endpoint}``: every answer;
* ``requests_in_flight``: requests admitted and not yet answered (the 429 threshold is
  ``max_concurrent_requests``); ``queue_depth``, ``queue_tokens``: inputs waiting for a batch;
* ``queue_duration_seconds``: from admission to the start of a request's first batch;
* ``batch_size``, ``batch_tokens``, ``batch_duration_seconds``: each forward pass;
* ``tokens_total``: tokens computed (``rate(clearformer_tokens_total[1m])`` is tokens/s);
  ``tokens_per_second``: the same over the last :data:`THROUGHPUT_WINDOW` seconds, as a gauge;
* ``ready``: 1 once every model is loaded and warmed, 0 while loading or draining.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

THROUGHPUT_WINDOW = 10.0  # seconds of finished batches the tokens/s gauge averages over
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
_TOKEN_BUCKETS = (16, 64, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


class ServerMetrics:
    """The metrics of one server; thread-safe (batch workers record from their threads)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "clearformer_requests",
            "Answers by endpoint and status",
            ["endpoint", "status"],
            registry=r,
        )
        self.request_seconds = Histogram(
            "clearformer_request_duration_seconds",
            "Time from arrival to answer",
            ["endpoint"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge(
            "clearformer_requests_in_flight", "Requests admitted and not yet answered", registry=r
        )
        self.queue_depth = Gauge(
            "clearformer_queue_depth", "Inputs waiting for a batch", registry=r
        )
        self.queue_tokens = Gauge(
            "clearformer_queue_tokens", "Tokens of the inputs waiting for a batch", registry=r
        )
        self.queue_seconds = Histogram(
            "clearformer_queue_duration_seconds",
            "Time from admission to the start of a request's first batch",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "clearformer_batch_size",
            "Inputs per forward pass",
            buckets=_SIZE_BUCKETS,
            registry=r,
        )
        self.batch_tokens = Histogram(
            "clearformer_batch_tokens",
            "Tokens per forward pass",
            buckets=_TOKEN_BUCKETS,
            registry=r,
        )
        self.batch_seconds = Histogram(
            "clearformer_batch_duration_seconds",
            "Time of one forward pass",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.tokens = Counter("clearformer_tokens", "Tokens computed", registry=r)
        self.tokens_per_second = Gauge(
            "clearformer_tokens_per_second",
            f"Tokens computed per second over the last {THROUGHPUT_WINDOW:g} s",
            registry=r,
        )
        self.tokens_per_second.set_function(self.throughput)
        self.ready = Gauge(
            "clearformer_ready", "1 once the models are loaded and warmed, else 0", registry=r
        )
        self._finished: deque[tuple[float, int]] = deque()  # (time, tokens) of recent batches
        self._lock = threading.Lock()

    def batch_done(self, inputs: int, tokens: int, seconds: float) -> None:
        self.batch_size.observe(inputs)
        self.batch_tokens.observe(tokens)
        self.batch_seconds.observe(seconds)
        self.tokens.inc(tokens)
        now = time.monotonic()
        with self._lock:
            self._finished.append((now, tokens))
            self._forget(now)

    def throughput(self) -> float:
        """Tokens per second over the last :data:`THROUGHPUT_WINDOW` seconds (0: none)."""
        now = time.monotonic()
        with self._lock:
            self._forget(now)
            return sum(tokens for _, tokens in self._finished) / THROUGHPUT_WINDOW

    def answered(self, endpoint: str, status: int, seconds: float) -> None:
        self.requests.labels(endpoint=endpoint, status=str(status)).inc()
        self.request_seconds.labels(endpoint=endpoint).observe(seconds)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)

    def _forget(self, now: float) -> None:
        while self._finished and self._finished[0][0] < now - THROUGHPUT_WINDOW:
            self._finished.popleft()
