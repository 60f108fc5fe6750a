"""``ServeConfig``: every limit and setting of ``clearformer serve``, validated once.

The CLI builds one from its flags (each flag is a field, same name); tests and embedders build
one directly. Defaults follow Hugging Face text-embeddings-inference where it has the same
setting (``--max-concurrent-requests``, ``--max-client-batch-size``, ``--payload-limit``), so a
deployment moved from one to the other behaves alike at its edges.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..checks import check_bool, check_choice, check_int, check_positive_float, check_positive_int
from ..options import BACKENDS
from ..precision import check_precision
from ..text.batching import DEFAULT_MAX_TOKENS


@dataclass(frozen=True)
class ServeConfig:
    """How ``clearformer serve`` listens, batches and limits (see docs/serving.md)."""

    host: str = "127.0.0.1"  # loopback: reachable from this machine only, until chosen otherwise
    port: int = 8080  # 0: any free port (the one taken is reported when listening)
    api_key: str | None = field(default=None, repr=False)  # Bearer token; never shown or logged
    # Real tokens (special tokens included) per forward pass. Batches are packed, so padding
    # costs nothing and only real tokens count; encode's padded budget, 4096, was its fastest.
    max_batch_tokens: int = DEFAULT_MAX_TOKENS
    # Requests admitted at once (queued or computing). One more is answered 429 at once, so
    # the queue is bounded: at most this many requests of max_client_batch_size inputs each.
    max_concurrent_requests: int = 512
    max_client_batch_size: int = 32  # inputs per request; more is 413
    # Tokens per input; None: each model's own limit (then results equal `clearformer encode`).
    # A longer input is 413 unless the request asks to truncate.
    max_input_tokens: int | None = None
    payload_limit: int = 2_000_000  # bytes of request body; more is 413
    # Seconds from arrival to answer, the body's upload included; then 503, work dropped.
    request_timeout: float = 60.0
    graceful_timeout: float = 30.0  # seconds a drain (SIGTERM, SIGINT) waits for requests
    # Forward passes side by side, the CPU threads split between them as encode's workers do;
    # None: two on a CPU with two or more threads, else one.
    workers: int | None = None
    # True: every batch runs on its worker's whole share of threads. False: a batch takes its
    # part of the CPUs that other processes leave free (clearformer.free_cpus): a parallel
    # region on a CPU another process keeps busy waits for it (docs/serving.md).
    fixed_threads: bool = False
    # "bf16" (alias "bfloat16"): every model runs its bfloat16 copy; "int8": embedding models
    # run encode(precision="int8")'s model (and "int8-blocks" encode(precision="int8-blocks")'s);
    # "auto": each model's fastest accurate precision.
    precision: str = "float32"
    backend: str = "auto"  # attention backend, as for encode
    # Where embedding and reranking models run (clearformer.devices.check_device): "cpu",
    # "cuda", "cuda:N". Sparse and multi-vector models run on the CPU alone.
    device: str = "cpu"

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host:
            raise ValueError(f"host must be a non-empty str, got {self.host!r}")
        check_int(self.port, "port", low=0, high=65536)
        if self.api_key is not None:
            check_api_key(self.api_key, "api_key")
        check_positive_int(self.max_batch_tokens, "max_batch_tokens")
        check_positive_int(self.max_concurrent_requests, "max_concurrent_requests")
        check_positive_int(self.max_client_batch_size, "max_client_batch_size")
        check_positive_int(self.max_input_tokens, "max_input_tokens", optional=True)
        check_positive_int(self.payload_limit, "payload_limit")
        for name in ("request_timeout", "graceful_timeout"):
            value = getattr(self, name)
            check_positive_float(value, name)
            # A timeout of inf passes that check but not the waits it bounds (a thread's
            # join, the drain's), which fail with OverflowError at shutdown.
            if not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number of seconds, got {value!r}")
        check_positive_int(self.workers, "workers", optional=True)
        check_bool(self.fixed_threads, "fixed_threads")
        check_precision(self.precision)
        check_choice(self.backend, BACKENDS, "backend")
        from ..devices import check_device
        from ..precision import is_int8

        where = check_device(self.device)
        if where.type != "cpu" and is_int8(self.precision):
            raise ValueError(
                f"precision={self.precision!r} runs on CPUs only; with device={self.device!r} "
                f"use 'bf16' or 'float32'"
            )


def check_api_key(key, name: str) -> None:
    """ValueError (TypeError for a non-str) unless ``key`` is a key a client can send: a
    non-empty str of printable ASCII, without spaces at its ends. A Bearer token is ASCII
    (RFC 6750), and the server reads the header as the bytes sent and strips its ends: any
    other key could never match, and would lock every client out. The key itself is never
    repeated in a message."""
    if not isinstance(key, str):
        raise TypeError(f"{name} must be a str, got {type(key).__name__}")
    if not key:
        raise ValueError(f"{name} must be a non-empty str, got an empty one")
    if not (key.isascii() and key.isprintable()):
        raise ValueError(
            f"{name} must be printable ASCII, as a Bearer token is (RFC 6750), got a key with "
            "another character, which no client could send"
        )
    if key != key.strip():
        raise ValueError(
            f"{name} must not start or end with a space, which the server strips from the "
            "header it compares, got a key that does"
        )
