"""``clearformer serve``: embedding and reranker models behind an HTTP server.

OpenAI's ``/v1/embeddings`` and text-embeddings-inference's ``/embed``, ``/rerank``,
``/tokenize``, ``/health``, ``/info``, with Prometheus ``/metrics``; requests of many clients
are batched together. Needs the serve extra (``pip install 'clearformer[serve]'``). The
flags are :class:`clearformer.serve.ServeConfig`'s fields; docs/serving.md describes each.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

from ..options import BACKENDS
from ..text.batching import DEFAULT_MAX_TOKENS
from .encode import add_precision_argument, positive_int

API_KEY_VARIABLE = "CLEARFORMER_API_KEY"
# Imported by the server; their absence is the one error a fresh install without the extra
# meets, so it is named before anything else.
_EXTRA_MODULES = ("uvicorn", "starlette", "prometheus_client")


def positive_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value!r}") from None
    # inf and nan parse as floats, but a timeout of either breaks the waits built on it.
    if not (number > 0 and math.isfinite(number)):
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {value}")
    return number


def port_number(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {value!r}") from None
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port in 0-65535, got {number}")
    return number


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "serve",
        help="serve embedding and reranker models over HTTP",
        description="Serve embedding models (OpenAI /v1/embeddings, TEI /embed) and "
        "cross-encoders (TEI /rerank) over HTTP, batching the requests of many clients "
        "together. Stops on SIGTERM or Ctrl-C after answering every request in flight. "
        "Needs: pip install 'clearformer[serve]'. See docs/serving.md.",
    )
    p.add_argument(
        "--model",
        action="append",
        metavar="[NAME=]DIR",
        default=None,
        help="a checkpoint directory to serve, as NAME (default: the directory's name); "
        "repeat for several; a *ForSequenceClassification checkpoint is served on /rerank "
        "(default: the bundled all-MiniLM-L6-v2)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback)")
    p.add_argument(
        "--port", type=port_number, default=8080, help="port (default 8080; 0: any free one)"
    )
    p.add_argument(
        "--api-key",
        metavar="KEY",
        default=None,
        help=f"require 'Authorization: Bearer KEY' on every route but /health (default: "
        f"${API_KEY_VARIABLE}, which keeps the key out of the process list; unset: no key)",
    )
    p.add_argument(
        "--max-batch-tokens",
        type=positive_int,
        default=DEFAULT_MAX_TOKENS,
        metavar="N",
        help=f"real tokens per forward pass (default {DEFAULT_MAX_TOKENS})",
    )
    p.add_argument(
        "--max-concurrent-requests",
        type=positive_int,
        default=512,
        metavar="N",
        help="requests admitted at once; more are answered 429 with Retry-After (default 512)",
    )
    p.add_argument(
        "--max-client-batch-size",
        type=positive_int,
        default=32,
        metavar="N",
        help="inputs per request; more is 413 (default 32)",
    )
    p.add_argument(
        "--max-input-tokens",
        type=positive_int,
        default=None,
        metavar="N",
        help="tokens per input, at most the model's own limit; a longer input is 413 unless "
        "the request asks to truncate (default: the model's limit)",
    )
    p.add_argument(
        "--payload-limit",
        type=positive_int,
        default=2_000_000,
        metavar="BYTES",
        help="request body size; more is 413 (default 2000000)",
    )
    p.add_argument(
        "--request-timeout",
        type=positive_float,
        default=60.0,
        metavar="SECONDS",
        help="a request not answered this long after it arrived (its body's upload included) "
        "is 503 and its work dropped (default 60)",
    )
    p.add_argument(
        "--graceful-timeout",
        type=positive_float,
        default=30.0,
        metavar="SECONDS",
        help="on SIGTERM or SIGINT, how long to wait for requests in flight (default 30)",
    )
    p.add_argument(
        "--workers",
        type=positive_int,
        default=None,
        metavar="N",
        help="batches run side by side, the CPU threads split between them (default: 2 on a "
        "CPU with 2 or more threads, else 1)",
    )
    p.add_argument(
        "--fixed-threads",
        action="store_true",
        help="every batch on its worker's whole share of threads, even while other processes "
        "keep CPUs busy (default: a batch takes the CPUs the others leave free)",
    )
    add_precision_argument(
        p,
        ("float32", "bf16", "int8", "int8-blocks"),
        "bf16 (bfloat16): embedding and reranking models run their bfloat16 copies, as "
        "encode --precision bf16 does; int8, int8-blocks: embedding models run encode "
        "--precision int8's (int8-blocks') model; cross-encoders run int8-blocks, and float32 "
        "under int8",
    )
    p.add_argument(
        "--backend", choices=BACKENDS, default="auto", help="attention backend (auto packs)"
    )
    p.add_argument(
        "--device",
        default="cpu",
        metavar="DEVICE",
        help="where embedding and reranking models run: cpu (default), cuda, cuda:N; sparse "
        "and multi-vector models run on the CPU; --precision int8 and int8-blocks run on the CPU "
        "alone",
    )
    p.set_defaults(func=run, writes_stdout=lambda args: False)


def run(args: argparse.Namespace) -> int:
    from ..cli import CliError

    missing = [name for name in _EXTRA_MODULES if not _importable(name)]
    if missing:
        raise CliError(
            f"clearformer serve needs the serve extra ({', '.join(missing)} not installed): "
            "pip install 'clearformer[serve]'"
        )
    # A server tokenizes each request's few texts on its event loop, and the tokenizers
    # library's thread pool then costs more than it saves (a one-text request 1.7x, a 32-text
    # one 1.2x slower with it) and keeps cores busy that the batch workers need.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from ..devices import check_device
    from ..serve import ModelSpec, ServeConfig
    from ..serve.server import run_server

    device = check_device(args.device, "--device")  # named as the flag, before anything starts
    specs = [ModelSpec.parse(value) for value in args.model or []]
    for spec in specs:  # a missing directory is an error now, not after the server started
        if spec.path is not None and not os.path.isdir(spec.path):
            raise CliError(f"--model: checkpoint directory not found: {spec.path}")
        if spec.path is not None and device.type != "cpu":
            from ..model_kinds import model_kind

            kind = model_kind(spec.path)
            if kind != "dense":
                raise CliError(
                    f"--model {spec.path}: a {kind} model runs on the CPU here; --device "
                    f"{args.device} places embedding and reranking models only"
                )
    config = ServeConfig(
        host=args.host,
        port=args.port,
        api_key=_api_key(args.api_key),
        max_batch_tokens=args.max_batch_tokens,
        max_concurrent_requests=args.max_concurrent_requests,
        max_client_batch_size=args.max_client_batch_size,
        max_input_tokens=args.max_input_tokens,
        payload_limit=args.payload_limit,
        request_timeout=args.request_timeout,
        graceful_timeout=args.graceful_timeout,
        workers=args.workers,
        fixed_threads=args.fixed_threads,
        precision=args.precision,
        backend=args.backend,
        device=args.device,
    )
    if not specs:
        from ..interop.hf import bundled_model_dir

        bundled_model_dir()  # FileNotFoundError with the install hint, before listening
    # A forward pass left running by a forced stop cannot outlive a normal interpreter exit
    # (run_server's _leave): the command ends the process there instead.
    return run_server(config, specs, report=_report, exit_when_busy=True)


def _api_key(flag: str | None) -> str | None:
    """The key from ``--api-key``, else from the environment, else None (no key). An empty
    one is refused: taken as "no key", a key meant to be set (``--api-key "$KEY"`` with
    ``KEY`` unset) would leave the server open without a word."""
    from ..cli import CliError
    from ..serve.config import check_api_key

    if flag is not None:
        if not flag:
            raise CliError(
                "--api-key: expected a key, got an empty value (leave the flag out to serve "
                "without a key)"
            )
        key, source = flag, "--api-key"
    else:
        key, source = os.environ.get(API_KEY_VARIABLE), API_KEY_VARIABLE
        if key is None:
            return None
        if not key:
            raise CliError(
                f"{API_KEY_VARIABLE} is set but empty: set it to the key, or unset it to serve "
                "without a key"
            )
    try:
        check_api_key(key, source)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    return key


def _report(message: str) -> None:
    print(f"clearformer serve: {message}", file=sys.stderr, flush=True)


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None
