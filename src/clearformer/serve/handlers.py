"""The routes' handlers: each parses its body (:mod:`.schemas`), picks its model, queues its
inputs and writes its answer in the shape of the API it copies. The checks every route shares
(the key, the slot) are :func:`clearformer.serve.app.create_app`'s wrapper's.

Inputs are tokenized on a worker thread (``asyncio.to_thread``): a body near the size limit
takes seconds, and on the event loop it would hold every other request and ``/health``."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable

import numpy as np
from starlette.requests import Request
from starlette.responses import Response

from .errors import ApiError
from .guards import check_count, read_json
from .render import check_finite, embed_body, json_body, openai_embeddings_body
from .schemas import (
    _shown,
    parse_embed,
    parse_openai_embeddings,
    parse_rerank,
    parse_tokenize,
)
from .sparse import parse_embed_sparse, sparse_rows_body
from .state import ServerState
from .waiting import ClientGone, deadline_of, disconnected, timed_out, wait_for_rows

Handler = Callable[[Request], Awaitable[Response]]


def health(state: ServerState) -> Handler:
    async def health(request: Request) -> Response:
        if state.status == "ready":
            return _json({"status": "ok"})
        return _json({"status": state.status}, status=503)

    return health


def info(state: ServerState) -> Handler:
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


def metrics(state: ServerState) -> Handler:
    from prometheus_client import CONTENT_TYPE_LATEST

    async def metrics(request: Request) -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return metrics


def models(state: ServerState) -> Handler:
    started = int(time.time())

    def described(name: str) -> dict:
        return {"id": name, "object": "model", "created": started, "owned_by": "clearformer"}

    async def models(request: Request) -> Response:
        return _json({"object": "list", "data": [described(m.name) for m in state.models]})

    return models


def model(state: ServerState) -> Handler:
    """OpenAI's ``GET /v1/models/{model}`` (the client's ``models.retrieve``): one served
    model by its name or an alias, as the client asked for it; 404 for another."""
    started = int(time.time())

    async def model(request: Request) -> Response:
        name = request.path_params["model"]
        state.any_model(name)  # 404 naming the served models
        return _json({"id": name, "object": "model", "created": started, "owned_by": "clearformer"})

    return model


def embed(state: ServerState) -> Handler:
    async def embed(request: Request) -> Response:
        parsed = parse_embed(await read_json(request, state.config))
        rows, _ = await _embeddings(state, request, parsed, field="inputs")
        return Response(embed_body(rows), media_type="application/json")

    return embed


def openai_embeddings(state: ServerState) -> Handler:
    async def embeddings(request: Request) -> Response:
        parsed = parse_openai_embeddings(await read_json(request, state.config))
        rows, (model, tokens) = await _embeddings(state, request, parsed, field="input")
        body = openai_embeddings_body(rows, parsed.encoding_format, model.name, tokens)
        return Response(body, media_type="application/json")

    return embeddings


async def _embeddings(state: ServerState, request: Request, parsed, *, field: str):
    """The rows of an embedding request (``/embed`` or ``/v1/embeddings``), with its model
    and its token count."""
    model = state.model_for(parsed.model, "embed")
    check_count(len(parsed.inputs), state.config, field)
    if parsed.dimensions is not None and parsed.dimensions > model.width:
        raise ApiError(
            "Validation",
            f"dimensions must be at most model {model.name!r}'s width of {model.width}, got "
            f"{_shown(parsed.dimensions)}",
            param="dimensions",
        )
    if parsed.dimensions is not None:
        try:  # one of the model's Matryoshka widths, where its files list them
            model.check_dimensions(parsed.dimensions)
        except ValueError as exc:
            message = f"model {model.name!r}: {exc}"
            raise ApiError("Validation", message, param="dimensions") from None
    normalize = model.normalize if parsed.normalize is None else parsed.normalize
    shorten = parsed.dimensions is not None and parsed.dimensions < model.width
    prepared = await asyncio.to_thread(
        model.prepare,
        parsed.inputs,
        field=field,
        # Shortened rows are normalised after the cut: that is what makes them unit vectors.
        normalize=normalize and not shorten,
        truncate=parsed.truncate,
        direction=parsed.direction,
        prompt_name=parsed.prompt_name,
    )
    rows = await wait_for_rows(state, request, model, prepared)
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


def rerank(state: ServerState) -> Handler:
    async def rerank(request: Request) -> Response:
        parsed = parse_rerank(await read_json(request, state.config))
        model = state.model_for(parsed.model, "rerank")
        if model.width != 1:
            raise ApiError(
                "Validation",
                f"model {model.name!r} gives {model.width} scores per pair (a classifier); "
                "rerank needs a cross-encoder with one",
                param="model",
            )
        check_count(len(parsed.texts), state.config, "texts")
        prepared = await asyncio.to_thread(
            model.prepare_pairs,
            parsed.query,
            parsed.texts,
            activation="identity" if parsed.raw_scores else model.model.activation,
            truncate=parsed.truncate,
            direction=parsed.direction,
        )
        scores = (await wait_for_rows(state, request, model, prepared))[:, 0]  # (n,)
        check_finite(scores[:, None])
        ranked = []
        # Highest first; equal scores keep the texts' order.
        for i in np.argsort(-scores, kind="stable").tolist():
            rank = {"index": i, "score": float(scores[i])}
            if parsed.return_text:
                rank["text"] = parsed.texts[i]
            ranked.append(rank)
        return _json(ranked)

    return rerank


def embed_sparse(state: ServerState) -> Handler:
    """TEI's ``/embed_sparse``, for sparse (SPLADE) models (:mod:`.sparse`) and bge-m3
    (:func:`.token_handlers.bge_m3_sparse`)."""

    async def embed_sparse(request: Request) -> Response:
        parsed = parse_embed_sparse(await read_json(request, state.config))
        model = state.model_for(parsed.model, "sparse")
        check_count(len(parsed.inputs), state.config, "inputs")
        if model.kind == "bge-m3":
            from .token_handlers import bge_m3_sparse

            return await bge_m3_sparse(state, request, model, parsed)
        prepared = await asyncio.to_thread(
            model.prepare_sparse,
            parsed.inputs,
            task=parsed.task,
            truncate=parsed.truncate,
            direction=parsed.direction,
        )
        rows = await wait_for_rows(state, request, model, prepared)  # (n, V)
        return Response(sparse_rows_body(rows), media_type="application/json")

    return embed_sparse


def tokenize(state: ServerState) -> Handler:
    async def tokenize(request: Request) -> Response:
        state.require_ready()
        parsed = parse_tokenize(await read_json(request, state.config))
        model = state.any_model(parsed.model)
        check_count(len(parsed.inputs), state.config, "inputs")
        deadline = deadline_of(state, request)
        abandoned = threading.Event()  # nobody waits for the answer: the thread stops
        # The answer is written on the worker thread too: for a body near the size limit it
        # is tens of megabytes of JSON, seconds of work that would hold every other request.
        work = asyncio.ensure_future(
            asyncio.to_thread(
                model.tokenize,
                parsed.inputs,
                add_special_tokens=parsed.add_special_tokens,
                prompt_name=parsed.prompt_name,
                deadline=deadline,
                abandoned=abandoned,
            )
        )
        gone = asyncio.ensure_future(disconnected(request))
        try:
            done, _ = await asyncio.wait(
                {work, gone},
                timeout=max(0.0, deadline - time.monotonic()),
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            gone.cancel()
        if work in done:
            try:
                return Response(work.result(), media_type="application/json")
            except TimeoutError:  # the thread saw the deadline pass first
                raise timed_out(state) from None
        # The thread stops at its next look; its end (a TimeoutError) is read, not logged.
        abandoned.set()
        work.add_done_callback(lambda task: task.cancelled() or task.exception())
        if gone in done:
            raise ClientGone  # counted 499, as on the embedding routes
        raise timed_out(state)

    return tokenize


def _json(payload, status: int = 200) -> Response:
    return Response(json_body(payload), status_code=status, media_type="application/json")
