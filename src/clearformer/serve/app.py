"""The ASGI application: routes, authentication, body limits, and the answer to each request.

Starlette, not FastAPI: the routes are few and their bodies are checked by
:mod:`.schemas`, whose messages name the field, what it must be and what came, in the shape of
the API each route copies (TEI's or OpenAI's error body). FastAPI's pydantic models would
answer type errors in a third shape of their own, and bring a schema layer the server does not
need; Starlette is the routing and request layer FastAPI itself is built on.

Every route but ``/health`` needs the API key when one is set. The routes that compute
(``/embed``, ``/v1/embeddings``, ``/rerank``) take a slot first: at ``max_concurrent_requests``
slots taken the answer is 429 at once, before the body is even read. A request then waits for
its batches, its client's disconnection (which frees the slot and drops its waiting inputs) or
``request_timeout`` (503), whichever comes first.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable

import numpy as np
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .config import ServeConfig
from .engine import Closed, Job
from .errors import ApiError
from .models import ModelSpec, Prepared, ServedModel
from .render import embed_body, json_body, openai_embeddings_body
from .schemas import parse_embed, parse_openai_embeddings, parse_rerank, parse_tokenize
from .state import ServerState

log = logging.getLogger(__name__)

Handler = Callable[[Request], Awaitable[Response]]


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


def create_app(
    config: ServeConfig,
    specs: list[ModelSpec] | None = None,
    *,
    report: Callable[[str], None] | None = None,
) -> Starlette:
    """The server's ASGI app; its :class:`ServerState` is ``app.state.serve``. Models load in a
    thread when the app starts (its lifespan), and the batch workers stop when it ends. A
    model that fails to load leaves ``/health`` at 503 ``"failed"`` and the exception in
    ``app.state.serve.load_error`` (:func:`~clearformer.serve.server.run_server` stops and
    raises it)."""
    state = ServerState(config, specs or [], report=report)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        state.start_loading()
        yield
        await asyncio.get_running_loop().run_in_executor(None, state.finish)

    routes = [
        Route("/health", _health(state), methods=["GET"]),
        Route("/info", _endpoint(state, "info", "tei", _info(state)), methods=["GET"]),
        Route("/metrics", _endpoint(state, "metrics", "tei", _metrics(state)), methods=["GET"]),
        Route("/v1/models", _endpoint(state, "models", "openai", _models(state)), methods=["GET"]),
        Route(
            "/embed",
            _endpoint(state, "embed", "tei", _embed(state), compute=True),
            methods=["POST"],
        ),
        Route(
            "/v1/embeddings",
            _endpoint(state, "embeddings", "openai", _openai_embeddings(state), compute=True),
            methods=["POST"],
        ),
        Route(
            "/rerank",
            _endpoint(state, "rerank", "tei", _rerank(state), compute=True),
            methods=["POST"],
        ),
        Route("/tokenize", _endpoint(state, "tokenize", "tei", _tokenize(state)), methods=["POST"]),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={404: _not_found, 405: _not_allowed},
    )
    app.state.serve = state
    return app


# The wrapper every route but /health goes through ----------------------------------------


def _endpoint(
    state: ServerState, name: str, api: str, handler: Handler, *, compute: bool = False
) -> Handler:
    async def endpoint(request: Request) -> Response:
        started = time.perf_counter()
        admitted = False
        try:
            _check_key(state.config, request)
            if compute:
                state.require_ready()
                state.admit()
                admitted = True
            response = await handler(request)
        except ApiError as exc:
            response = _error(exc, api)
        except ClientGone:
            # Nobody reads this answer; 499 (nginx's "client closed request") in the metrics.
            response = Response(status_code=499)
        except asyncio.CancelledError:
            # Only the server cancels a request: a drain past graceful_timeout, or a second
            # signal. The client gets a 503 it can retry elsewhere (uvicorn would send a bare
            # 500), and the exit status says some work was left undone.
            state.cut_off += 1
            response = _error(
                ApiError(
                    "Unhealthy",
                    "the server shut down before this request was finished "
                    f"(graceful_timeout, {state.config.graceful_timeout:g} s); retry it",
                    headers={"Retry-After": "1", "Connection": "close"},
                ),
                api,
            )
        except Exception as exc:
            log.exception("%s failed", request.url.path)
            response = _error(ApiError("Backend", f"internal error: {type(exc).__name__}"), api)
        finally:
            if admitted:
                state.release()
        state.metrics.answered(name, response.status_code, time.perf_counter() - started)
        return response

    return endpoint


def _check_key(config: ServeConfig, request: Request) -> None:
    """401 unless the request carries the API key as a Bearer token (none set: no check).
    Compared in constant time, so the answer's timing tells nothing of the key."""
    if config.api_key is None:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    given = token.strip().encode("utf-8", "surrogateescape")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given, config.api_key.encode()):
        raise ApiError(
            "Unauthorized",
            "missing or wrong API key: send the header 'Authorization: Bearer <key>'",
            headers={"WWW-Authenticate": "Bearer"},
        )


async def _read_json(request: Request, limit: int):
    """The body as JSON, at most ``limit`` bytes (413 past it, 400 for what is not JSON)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _too_large(int(declared), limit)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise _too_large(len(body), limit, at_least=True)
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError("Malformed", f"the body is not valid JSON: {exc}") from None


def _too_large(size: int, limit: int, *, at_least: bool = False) -> ApiError:
    more = "more than " if at_least else ""
    return ApiError(
        "TooLarge",
        f"the body has {more}{size:,} bytes, over the limit of {limit:,} (payload_limit)",
        # The rest of the body is not read: the connection cannot carry another request.
        headers={"Connection": "close"},
    )


def _check_count(count: int, config: ServeConfig, field: str) -> None:
    if count > config.max_client_batch_size:
        raise ApiError(
            "TooLarge",
            f"{field} has {count} inputs, over the limit of {config.max_client_batch_size} "
            "per request (max_client_batch_size); send them in several requests",
            param=field,
        )


async def _compute(state: ServerState, request: Request, model: ServedModel, prepared: Prepared):
    """Queue the inputs and wait for their rows: (n, width) float32 in input order."""
    engine = state.require_ready()
    job = Job(model, prepared, asyncio.get_running_loop())
    try:
        engine.submit(job)
    except Closed:
        raise ApiError(
            "Unhealthy", "not ready: the server is shutting down", headers={"Retry-After": "1"}
        ) from None
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        done, _ = await asyncio.wait(
            {job.future, gone},
            timeout=state.config.request_timeout,
            return_when=asyncio.FIRST_COMPLETED,
        )
    except asyncio.CancelledError:
        engine.cancel(job)
        raise
    finally:
        gone.cancel()
    if job.future.done():
        return job.future.result()
    engine.cancel(job)
    if gone in done:
        raise ClientGone
    raise ApiError(
        "Unhealthy",
        f"the request was not answered within {state.config.request_timeout:g} s "
        "(request_timeout); its work was dropped",
        headers={"Retry-After": str(engine.retry_after())},
    )


async def _disconnected(request: Request) -> None:
    """Returns when the client has gone. The body is read by now, so the next message is the
    disconnection (the server sends it too once the answer is out, when nobody waits)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


# Routes -------------------------------------------------------------------------------


def _health(state: ServerState) -> Handler:
    async def health(request: Request) -> Response:
        if state.status == "ready":
            return _json({"status": "ok"})
        return _json({"status": state.status}, status=503)

    return health


def _info(state: ServerState) -> Handler:
    from .. import __version__

    async def info(request: Request) -> Response:
        config = state.config
        first = state.models[0].info() if state.models else {}
        return _json(
            {
                **first,
                "model_sha": None,
                "max_concurrent_requests": config.max_concurrent_requests,
                "max_batch_tokens": config.max_batch_tokens,
                "max_batch_requests": None,
                "max_client_batch_size": config.max_client_batch_size,
                "auto_truncate": False,
                "tokenization_workers": 1,
                "payload_limit": config.payload_limit,
                "request_timeout": config.request_timeout,
                "version": __version__,
                "router": "clearformer",
                "status": state.status,
                "models": [model.info() for model in state.models],
            }
        )

    return info


def _metrics(state: ServerState) -> Handler:
    from prometheus_client import CONTENT_TYPE_LATEST

    async def metrics(request: Request) -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return metrics


def _models(state: ServerState) -> Handler:
    started = int(time.time())

    async def models(request: Request) -> Response:
        data = [
            {"id": m.name, "object": "model", "created": started, "owned_by": "clearformer"}
            for m in state.models
        ]
        return _json({"object": "list", "data": data})

    return models


def _embed(state: ServerState) -> Handler:
    async def embed(request: Request) -> Response:
        parsed = parse_embed(await _read_json(request, state.config.payload_limit))
        rows, _ = await _embeddings(state, request, parsed, field="inputs")
        return Response(embed_body(rows), media_type="application/json")

    return embed


def _openai_embeddings(state: ServerState) -> Handler:
    async def embeddings(request: Request) -> Response:
        parsed = parse_openai_embeddings(await _read_json(request, state.config.payload_limit))
        rows, (model, tokens) = await _embeddings(state, request, parsed, field="input")
        body = openai_embeddings_body(rows, parsed.encoding_format, model.name, tokens)
        return Response(body, media_type="application/json")

    return embeddings


async def _embeddings(state: ServerState, request: Request, parsed, *, field: str):
    """The rows of an embedding request (``/embed`` or ``/v1/embeddings``), with its model
    and its token count."""
    model = state.model_for(parsed.model, "embed")
    _check_count(len(parsed.inputs), state.config, field)
    if parsed.dimensions is not None and parsed.dimensions > model.width:
        raise ApiError(
            "Validation",
            f"dimensions must be at most model {model.name!r}'s width of {model.width}, got "
            f"{parsed.dimensions}",
            param="dimensions",
        )
    normalize = model.model.normalize if parsed.normalize is None else parsed.normalize
    shorten = parsed.dimensions is not None and parsed.dimensions < model.width
    prepared = model.prepare(
        parsed.inputs,
        field=field,
        # Shortened rows are normalised after the cut: that is what makes them unit vectors.
        normalize=normalize and not shorten,
        truncate=parsed.truncate,
        direction=parsed.direction,
        prompt_name=parsed.prompt_name,
    )
    rows = await _compute(state, request, model, prepared)
    if shorten:
        rows = _shorten(rows, parsed.dimensions, normalize)
    return rows, (model, prepared.tokens)


def _shorten(rows: np.ndarray, dimensions: int, normalize: bool) -> np.ndarray:
    """The first ``dimensions`` values of each row (Matryoshka), L2-normalised when asked as
    ``encode`` normalises (``torch.nn.functional.normalize``)."""
    import torch
    import torch.nn.functional as F

    rows = np.ascontiguousarray(rows[:, :dimensions])
    if normalize:
        rows = F.normalize(torch.from_numpy(rows), p=2.0, dim=-1).numpy()
    return rows


def _rerank(state: ServerState) -> Handler:
    async def rerank(request: Request) -> Response:
        parsed = parse_rerank(await _read_json(request, state.config.payload_limit))
        model = state.model_for(parsed.model, "rerank")
        if model.width != 1:
            raise ApiError(
                "Validation",
                f"model {model.name!r} gives {model.width} scores per pair (a classifier); "
                "rerank needs a cross-encoder with one",
                param="model",
            )
        _check_count(len(parsed.texts), state.config, "texts")
        prepared = model.prepare_pairs(
            parsed.query,
            parsed.texts,
            activation="identity" if parsed.raw_scores else model.model.activation,
            truncate=parsed.truncate,
            direction=parsed.direction,
        )
        scores = (await _compute(state, request, model, prepared))[:, 0]  # (n,)
        ranked = []
        # Highest first; equal scores keep the texts' order.
        for i in np.argsort(-scores, kind="stable").tolist():
            rank = {"index": i, "score": float(scores[i])}
            if parsed.return_text:
                rank["text"] = parsed.texts[i]
            ranked.append(rank)
        return _json(ranked)

    return rerank


def _tokenize(state: ServerState) -> Handler:
    async def tokenize(request: Request) -> Response:
        state.require_ready()
        parsed = parse_tokenize(await _read_json(request, state.config.payload_limit))
        model = state.any_model(parsed.model)
        _check_count(len(parsed.inputs), state.config, "inputs")
        return _json(
            model.tokenize(
                parsed.inputs,
                add_special_tokens=parsed.add_special_tokens,
                prompt_name=parsed.prompt_name,
            )
        )

    return tokenize


# Answers ------------------------------------------------------------------------------


def _json(payload, status: int = 200) -> Response:
    return Response(json_body(payload), status_code=status, media_type="application/json")


def _error(exc: ApiError, api: str) -> Response:
    return Response(
        exc.body(api), status_code=exc.status, headers=exc.headers, media_type="application/json"
    )


async def _not_found(request: Request, exc) -> Response:
    api = "openai" if request.url.path.startswith("/v1/") else "tei"
    return _error(ApiError("NotFound", f"no route {request.url.path}"), api)


async def _not_allowed(request: Request, exc) -> Response:
    api = "openai" if request.url.path.startswith("/v1/") else "tei"
    error = ApiError("NotFound", f"{request.method} is not allowed on {request.url.path}")
    response = _error(error, api)
    response.status_code = 405
    return response
