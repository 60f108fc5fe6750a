"""What a request must pass before it costs anything: the API key, the body's size and JSON,
the number of inputs. Each failure is an :class:`~clearformer.serve.errors.ApiError` naming the
limit and the setting that sets it."""

from __future__ import annotations

import hmac
import json

from starlette.requests import Request

from .config import ServeConfig
from .errors import ApiError


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


async def read_json(request: Request, limit: int):
    """The body as JSON, at most ``limit`` bytes (413 past it, 400 for what is not JSON)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large(int(declared), limit)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise too_large(len(body), limit, at_least=True)
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError("Malformed", f"the body is not valid JSON: {exc}") from None


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
