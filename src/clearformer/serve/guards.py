"""What a request must pass before it costs anything: the API key, the body's size, time and
JSON, the number of inputs. Each failure is an :class:`~clearformer.serve.errors.ApiError`
naming the limit and the setting that sets it (a client gone mid-body: ``ClientGone``)."""

from __future__ import annotations

import asyncio
import hmac
import json
import time

from starlette.requests import ClientDisconnect, Request

from .config import ServeConfig
from .errors import ApiError, ClientGone


def check_key(config: ServeConfig, request: Request) -> None:
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


async def read_json(request: Request, config: ServeConfig):
    """The body as JSON: at most ``payload_limit`` bytes (413 past it), all of it within the
    request's time (503 past it), and JSON (400 for what is not, however it is malformed).

    The request's time is ``request_timeout`` from its arrival (``request.state.deadline``, set
    by the app's wrapper): the same bound as for its answer, so that a client sending its body
    slowly holds its slot no longer than one whose work is slow. A client that disconnects
    before its body is in is :class:`~clearformer.serve.errors.ClientGone` (499)."""
    limit = config.payload_limit
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large(int(declared), limit)
    body = bytearray()
    deadline = getattr(request.state, "deadline", None)
    if deadline is None:
        deadline = time.monotonic() + config.request_timeout
    try:
        await asyncio.wait_for(_read(request, body, limit), max(0.0, deadline - time.monotonic()))
    except asyncio.TimeoutError:
        expected = f" of {int(declared):,}" if declared.isdigit() else ""
        raise ApiError(
            "Unhealthy",
            f"the body did not arrive within {config.request_timeout:g} s (request_timeout): "
            f"{len(body):,}{expected} bytes came",
            # The rest of the body is not read: the connection cannot carry another request.
            headers={"Retry-After": "1", "Connection": "close"},
        ) from None
    except ClientDisconnect:
        raise ClientGone from None
    try:
        # JSON between systems is UTF-8 (RFC 8259, 8.1); json.loads would guess UTF-16 or
        # UTF-32 from a body's first bytes and read what no client meant to send.
        text = bytes(body).decode("utf-8-sig")  # a BOM ignored, as RFC 8259 allows
    except UnicodeDecodeError as exc:
        raise ApiError(
            "Malformed",
            f"the body is not valid JSON: it is not UTF-8 (byte 0x{body[exc.start]:02x} at "
            f"offset {exc.start:,})",
        ) from None
    try:
        return json.loads(text, parse_constant=_no_constant)
    except ValueError as exc:
        raise ApiError("Malformed", f"the body is not valid JSON: {exc}") from None
    except RecursionError:
        # Arrays or objects nested about a thousand deep (a kilobyte of "[") exhaust the
        # parser's recursion: malformed input, whatever the grammar says.
        raise ApiError(
            "Malformed",
            "the body is not valid JSON here: its arrays or objects nest too deeply to be read",
        ) from None


def _no_constant(name: str):
    # Python's json reads NaN and Infinity, which JSON does not have (RFC 8259, 6).
    raise ValueError(f"{name} is not a JSON value (JSON has no NaN or infinity)")


async def _read(request: Request, body: bytearray, limit: int) -> None:
    """The body's bytes into ``body`` (kept by the caller: what came before a timeout)."""
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise too_large(len(body), limit, at_least=True)


def too_large(size: int, limit: int, *, at_least: bool = False) -> ApiError:
    more = "more than " if at_least else ""
    return ApiError(
        "TooLarge",
        f"the body has {more}{size:,} bytes, over the limit of {limit:,} (payload_limit)",
        # The rest of the body is not read: the connection cannot carry another request.
        headers={"Connection": "close"},
    )


def check_count(count: int, config: ServeConfig, field: str) -> None:
    if count > config.max_client_batch_size:
        raise ApiError(
            "TooLarge",
            f"{field} has {count} inputs, over the limit of {config.max_client_batch_size} "
            "per request (max_client_batch_size); send them in several requests",
            param=field,
        )
