"""``ApiError``: an answer other than 200, with its status, and the two shapes it is sent in.

The TEI routes answer ``{"error": message, "error_type": kind}``, as text-embeddings-inference
does; the OpenAI routes (``/v1/...``) answer ``{"error": {"message", "type", "param",
"code"}}``, which the ``openai`` client reads into its exceptions. The status codes are one
table for both (:data:`STATUS`): the size limits are 413, a malformed body 400, a well-formed
body with a wrong field 422, a full queue 429, a server not ready or draining 503.
:class:`ClientGone` is the one outcome with no answer: the client left (499 in the metrics).
"""

from __future__ import annotations

import json

# kind -> HTTP status. The kinds are TEI's error types, plus the ones it has no name for.
STATUS = {
    "Empty": 400,  # no inputs
    "Malformed": 400,  # a body that is not JSON
    "Unauthorized": 401,
    "NotFound": 404,  # no such model or route
    "Validation": 422,  # a field of the wrong type or value
    "TooLarge": 413,  # too many inputs, an input over the token limit, too large a body
    "Overloaded": 429,  # no free slot: retry after Retry-After seconds
    "Unhealthy": 503,  # loading, draining or timed out
    "Backend": 500,  # the model failed
}
# OpenAI's error types, by status.
_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
}


class ApiError(Exception):
    """An error answer: ``kind`` (a key of :data:`STATUS`) sets the status; ``param`` names
    the request field at fault, when one is; ``headers`` go with the answer (Retry-After)."""

    def __init__(
        self,
        kind: str,
        message: str,
        *,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        if kind not in STATUS:
            raise ValueError(f"kind must be one of {tuple(STATUS)}, got {kind!r}")
        self.kind = kind
        self.message = message
        self.param = param
        self.headers = dict(headers or {})

    @property
    def status(self) -> int:
        return STATUS[self.kind]

    def body(self, api: str) -> bytes:
        """The JSON body in ``api``'s shape: ``"tei"`` or ``"openai"``."""
        if api == "openai":
            payload = {
                "error": {
                    "message": self.message,
                    "type": _OPENAI_TYPES.get(self.status, "invalid_request_error"),
                    "param": self.param,
                    "code": self.status,
                }
            }
        else:
            payload = {"error": self.message, "error_type": self.kind}
        return json.dumps(payload, ensure_ascii=False).encode()


class ClientGone(Exception):
    """The client disconnected before its answer was ready: while it sent its body, or while
    its request waited for its rows. Nobody reads an answer; the metrics count it as 499
    (nginx's "client closed request")."""
