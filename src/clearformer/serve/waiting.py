"""A request waiting for its rows: whichever comes first of its answer, its client's
disconnection (which frees the slot and drops its waiting inputs) or the end of its
``request_timeout`` (503), which began when it arrived: the time its body took counts.
"""

from __future__ import annotations

import asyncio
import time

from starlette.requests import Request

from .batcher import Closed, Job
from .errors import ApiError, ClientGone
from .models import Prepared, ServedModel
from .state import ServerState

__all__ = ["ClientGone", "deadline_of", "disconnected", "timed_out", "wait_for_rows"]


async def wait_for_rows(
    state: ServerState, request: Request, model: ServedModel, prepared: Prepared
):
    """Queue the inputs and wait for their rows: (n, width) float32 in input order.

    The request was admitted while the server was ready; a drain that began since still lets
    it finish (the batcher takes work until the drain has answered every request admitted).
    ``request_timeout`` counts from the admission (``request.state.admitted``), where the
    app's wrapper set ``request.state.deadline``."""
    batcher = state.batcher
    admitted = getattr(request.state, "admitted", None) or time.monotonic()
    deadline = getattr(request.state, "deadline", None) or admitted + state.config.request_timeout
    job = Job(model, prepared, asyncio.get_running_loop(), admitted=admitted)
    try:
        batcher.submit(job)
    except Closed:
        raise ApiError(
            "Unhealthy", "not ready: the server is shutting down", headers={"Retry-After": "1"}
        ) from None
    gone = asyncio.ensure_future(disconnected(request))
    left = deadline - time.monotonic()
    try:
        done, _ = await asyncio.wait(
            {job.future, gone}, timeout=max(left, 0.0), return_when=asyncio.FIRST_COMPLETED
        )
    except asyncio.CancelledError:
        _give_up(batcher, job)
        raise
    finally:
        gone.cancel()
    if job.future.done():
        return job.future.result()
    _give_up(batcher, job)
    if gone in done:
        raise ClientGone
    raise timed_out(state)


def deadline_of(state: ServerState, request: Request) -> float:
    """When the request's ``request_timeout`` ends (``time.monotonic()``): as the app's wrapper
    set it at its arrival, else from now."""
    deadline = getattr(request.state, "deadline", None)
    return time.monotonic() + state.config.request_timeout if deadline is None else deadline


def timed_out(state: ServerState) -> ApiError:
    """The 503 of a request not answered within ``request_timeout``."""
    return ApiError(
        "Unhealthy",
        f"the request was not answered within {state.config.request_timeout:g} s "
        "(request_timeout); its work was dropped",
        headers={"Retry-After": str(state.batcher.retry_after())},
    )


def _give_up(batcher, job: Job) -> None:
    """Drop a job nobody waits for any more. Its future is cancelled so that a batch of its
    failing later sets no exception on it that nobody would read (asyncio logs those as
    "Future exception was never retrieved"); one already set is read here."""
    batcher.cancel(job)
    if job.future.done():
        if not job.future.cancelled():
            job.future.exception()
    else:
        job.future.cancel()


async def disconnected(request: Request) -> None:
    """Returns when the client has gone. The body is read by now, so the next message is the
    disconnection (the server sends it too once the answer is out, when nobody waits)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
