"""The routes of token-level outputs: ``POST /embed_multivector`` (a vector per token: a
multi-vector model's, or bge-m3's ColBERT vectors) and ``POST /embed_sparse`` on bge-m3 (its
token weights, in text-embeddings-inference's sparse format).

``/embed_multivector`` takes ``{"inputs": str | [str], "mode": "query" | "document",
"model"?, "truncate"?, "truncation_direction"?}`` and answers ``[[[float, ...] per token] per
input]``; ``mode`` picks the side a ColBERT model encodes (queries get their marker and
expansion, documents their skiplist); a too-long text is cut at its end, as the model cuts it,
unless ``"truncate": false`` (413), and ``"truncation_direction": "left"`` is refused (422).
``/embed_sparse`` takes TEI's ``{"inputs", "model"?}`` and answers
``[[{"index": token id, "value": weight}, ...] per input]``, ids ascending.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import numpy as np
from starlette.requests import Request
from starlette.responses import Response

from .errors import ApiError
from .guards import check_count, read_json
from .render import float_rows, json_body
from .schemas import _direction, _flag, _object, _optional, _shown, _texts
from .state import ServerState
from .waiting import wait_for_rows

MODES = ("query", "document")


@dataclass(frozen=True)
class TokenRequest:
    """``POST /embed_multivector`` and ``POST /embed_sparse`` (on bge-m3)."""

    inputs: list[str]
    model: str | None = None
    mode: str = "document"
    # As on /embed: None (not sent) cuts a too-long text as the model does; false refuses it.
    truncate: bool | None = None
    direction: str = "right"


def parse_token_request(body: Any, *, mode_required: bool) -> TokenRequest:
    """``inputs`` (a string or a list), ``model``, ``mode`` (``"query"`` or ``"document"``,
    required where ``mode_required``: a query encoded as a document would silently score
    otherwise), and TEI's ``truncate`` and ``truncation_direction``, which the model holds to
    or refuses by name (:meth:`.token_models.TokenVectorModel.prepare_tokens`)."""
    body = _object(body)
    mode = body.get("mode")
    if mode is None and not mode_required:
        mode = "document"
    if mode not in MODES:
        raise ApiError(
            "Validation", f"mode must be 'query' or 'document', got {_shown(mode)}", param="mode"
        )
    return TokenRequest(
        inputs=_texts(body, "inputs"),
        model=_optional(body, "model", str, "a string"),
        mode=mode,
        truncate=_flag(body, "truncate", None),
        direction=_direction(body),
    )


def embed_multivector(state: ServerState):
    async def embed_multivector(request: Request) -> Response:
        parsed = parse_token_request(await read_json(request, state.config), mode_required=True)
        model = state.model_for(parsed.model, "multivector")
        check_count(len(parsed.inputs), state.config, "inputs")
        prepared = await asyncio.to_thread(
            model.prepare_tokens,
            parsed.inputs,
            output="colbert",
            side=parsed.mode,
            field="inputs",
            truncate=parsed.truncate,
            direction=parsed.direction,
        )
        payloads = await wait_for_rows(state, request, model, prepared)  # (n, 1) objects
        texts = []
        for (vectors,) in payloads:
            # A text whose every token is skipped has no vectors: an empty list.
            texts.append("[" + ",".join(float_rows(vectors)) + "]" if len(vectors) else "[]")
        return Response(("[" + ",".join(texts) + "]").encode(), media_type="application/json")

    return embed_multivector


async def bge_m3_sparse(state: ServerState, request: Request, model, parsed) -> Response:
    """``/embed_sparse`` answered by a bge-m3 model (:func:`.handlers.embed_sparse` asks, with
    its parsed body): its token weights, one pass per batch as for its other outputs."""
    if parsed.task != "document":
        raise ApiError(
            "Validation",
            f"task must be 'document' for model {model.name!r}: bge-m3 has one sparse side, "
            f"got {parsed.task!r}",
            param="task",
        )
    prepared = await asyncio.to_thread(
        model.prepare_tokens,
        parsed.inputs,
        output="sparse",
        side="document",
        field="inputs",
        truncate=parsed.truncate,
        direction=parsed.direction,
    )
    payloads = await wait_for_rows(state, request, model, prepared)  # (n, 1) objects
    answer = []
    for ((ids, weights),) in payloads:
        if not np.isfinite(weights).all():
            raise ApiError("Backend", "a sparse weight is not finite (NaN or infinity)")
        answer.append(
            [
                {"index": int(i), "value": float(v)}
                for i, v in zip(ids.tolist(), weights.tolist(), strict=True)
            ]
        )
    return Response(json_body(answer), media_type="application/json")
