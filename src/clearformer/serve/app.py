"""The ASGI application: the route table, and the wrapper every route but ``/health`` goes
through (the API key, a slot for the routes that compute, the error answers, the metrics).

Starlette, not FastAPI: the routes are few and their bodies are checked by
:mod:`.schemas`, whose messages name the field, what it must be and what came, in the shape of
the API each route copies (TEI's or OpenAI's error body). FastAPI's pydantic models would
answer type errors in a third shape of their own, and bring a schema layer the server does not
need; Starlette is the routing and request layer FastAPI itself is built on.

Every route but ``/health`` needs the API key when one is set. The routes that compute
(``/embed``, ``/v1/embeddings``, ``/rerank``) take a slot first: at ``max_concurrent_requests``
slots taken the answer is 429 at once, before the body is even read. ``request_timeout``
starts then, at arrival: the body must be in before it ends (503, the slot freed), and the
request then waits for its batches, its client's disconnection (which frees the slot and drops
its waiting inputs) or the rest of ``request_timeout`` (503), whichever comes first.

Every answer of a route, and of a path or method no route has (``endpoint="unknown"``), is
counted in ``clearformer_requests_total`` by its status; a client gone is counted as 499.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from . import handlers, token_handlers
from .config import ServeConfig
from .errors import ApiError, ClientGone
from .guards import check_key
from .handlers import Handler
from .models import ModelSpec
from .state import ServerState

log = logging.getLogger(__name__)


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

    def route(path, method, name, api, handler, *, compute=False):
        return Route(path, _endpoint(state, name, api, handler, compute=compute), methods=[method])

    table = [
        Route("/health", handlers.health(state), methods=["GET"]),  # open, unwrapped: probes
        route("/info", "GET", "info", "tei", handlers.info(state)),
        route("/metrics", "GET", "metrics", "tei", handlers.metrics(state)),
        route("/v1/models", "GET", "models", "openai", handlers.models(state)),
        route("/v1/models/{model:path}", "GET", "models", "openai", handlers.model(state)),
        route("/embed", "POST", "embed", "tei", handlers.embed(state), compute=True),
        route(
            "/v1/embeddings",
            "POST",
            "embeddings",
            "openai",
            handlers.openai_embeddings(state),
            compute=True,
        ),
        route("/rerank", "POST", "rerank", "tei", handlers.rerank(state), compute=True),
        route(
            "/embed_multivector",
            "POST",
            "embed_multivector",
            "tei",
            token_handlers.embed_multivector(state),
            compute=True,
        ),
        route(
            "/embed_sparse",
            "POST",
            "embed_sparse",
            "tei",
            handlers.embed_sparse(state),
            compute=True,
        ),
        # Tokenizing a body near the size limit takes seconds: it takes a slot like the rest.
        route("/tokenize", "POST", "tokenize", "tei", handlers.tokenize(state), compute=True),
    ]
    app = Starlette(
        routes=table,
        lifespan=lifespan,
        exception_handlers={404: _counted(state, _not_found), 405: _counted(state, _not_allowed)},
    )
    # Starlette answers "/embed/" with a 307 to "/embed" of its own, before the key is checked
    # and past the metrics: every path no route has is a counted 404 here.
    app.router.redirect_slashes = False
    app.state.serve = state
    return app


# The wrapper every route but /health goes through ----------------------------------------


def _endpoint(
    state: ServerState, name: str, api: str, handler: Handler, *, compute: bool = False
) -> Handler:
    async def endpoint(request: Request) -> Response:
        started = time.perf_counter()
        admitted = False
        # request_timeout bounds everything from here on: the body's arrival (guards.read_json)
        # and the wait for the rows (waiting.wait_for_rows).
        request.state.deadline = time.monotonic() + state.config.request_timeout
        try:
            check_key(state.config, request)
            if compute:
                state.require_ready()
                state.admit()
                admitted = True
                request.state.admitted = time.monotonic()
            response = await handler(request)
        except ApiError as exc:
            response = _error(exc, api)
        except (ClientGone, ClientDisconnect):
            # Nobody reads this answer; 499 (nginx's "client closed request") in the metrics.
            response = Response(status_code=499)
        except asyncio.CancelledError:
            # Only the server cancels a request: a drain past graceful_timeout, or a second
            # signal. The client gets a 503 it can retry elsewhere (uvicorn would send a bare
            # 500), and the exit status says some work was left undone.
            state.cut_off += 1
            why = (
                "a second signal stopped it at once"
                if state.forced
                else f"graceful_timeout, {state.config.graceful_timeout:g} s"
            )
            response = _error(
                ApiError(
                    "Unhealthy",
                    f"the server shut down before this request was finished ({why}); retry it",
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


# Answers -----------------------------------------------------------------------------


def _error(exc: ApiError, api: str) -> Response:
    return Response(
        exc.body(api), status_code=exc.status, headers=exc.headers, media_type="application/json"
    )


def _counted(
    state: ServerState, answer: Callable[[Request, Exception], Awaitable[Response]]
) -> Callable[[Request, Exception], Awaitable[Response]]:
    """An answer to a path or a method no route has, counted as ``endpoint="unknown"`` (one
    label for all of them: a label per path would let clients grow the metrics)."""

    async def counted(request: Request, exc: Exception) -> Response:
        started = time.perf_counter()
        response = await answer(request, exc)
        state.metrics.answered("unknown", response.status_code, time.perf_counter() - started)
        return response

    return counted


async def _not_found(request: Request, exc) -> Response:
    api = "openai" if request.url.path.startswith("/v1/") else "tei"
    return _error(ApiError("NotFound", f"no route {request.url.path}"), api)


async def _not_allowed(request: Request, exc) -> Response:
    api = "openai" if request.url.path.startswith("/v1/") else "tei"
    # The route's methods, which a 405 must name in Allow (RFC 9110, 15.5.6); Starlette
    # lists them from a set, in an order that changes from one process to the next.
    headers = dict(getattr(exc, "headers", None) or {})
    takes = ""
    if headers.get("Allow"):
        headers["Allow"] = ", ".join(sorted(m.strip() for m in headers["Allow"].split(",")))
        takes = f": it takes {headers['Allow']}"
    error = ApiError(
        "NotFound", f"{request.method} is not allowed on {request.url.path}{takes}", headers=headers
    )
    response = _error(error, api)
    response.status_code = 405
    return response
