"""``run_server``: the app on uvicorn, with a graceful drain on SIGTERM and SIGINT.

uvicorn already drains: on its exit flag it closes the listening socket (new connections are
refused, and a load balancer moves them to another instance), closes idle keep-alive
connections, waits for the requests in flight (``timeout_graceful_shutdown`` bounds the wait,
then cancels what is left) and ends the app's lifespan, where the batch workers stop. Two
things differ here:

* the server marks itself draining at the signal, so ``/health`` answers 503 and a request
  arriving on a connection kept alive gets 503, not work;
* uvicorn re-raises the signal once it has stopped, so that the process dies of it; a drained
  server has answered the signal, so ``run_server`` returns instead and the process exits 0
  (1 if the drain's bound cut requests off: they are answered 503). A second signal stops
  at once (1 as well if it cut requests off).

A stop that cuts requests off can leave a batch worker inside a forward pass; the CLI then ends
the process with ``os._exit`` rather than let the interpreter finish (:func:`_leave` says why).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Generator
from typing import NoReturn

import uvicorn

from .app import create_app
from .config import ServeConfig
from .models import ModelSpec
from .state import ServerState

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT)


def run_server(
    config: ServeConfig,
    specs: list[ModelSpec] | None = None,
    *,
    report: Callable[[str], None] | None = None,
    exit_when_busy: bool = False,
) -> int:
    """Serve until SIGTERM or SIGINT, then drain. Returns the exit status: 0 when every
    request in flight was answered, 1 when ``graceful_timeout`` or a second signal cut some
    off.

    Args:
        config: the server's settings.
        specs: the models (none: the bundled all-MiniLM-L6-v2).
        report: called with a line for the operator at each step (listening, ready,
            draining, stopped); the CLI prints them.
        exit_when_busy: when a thread still computes once the server has stopped (a batch
            worker inside a forward pass, or the models still loading), end the process with
            ``os._exit(status)`` after flushing the logs instead of returning (the CLI's
            choice, see :func:`_leave`). Otherwise the thread finishes its batch in the
            background and then ends; a process that exits at once meets what ``_leave``
            avoids.

    Raises:
        OSError: the address cannot be bound.
        Exception: what loading a model raised (a missing or broken checkpoint).
    """
    report = report or (lambda message: None)
    app = create_app(config, specs, report=report)
    state = app.state.serve
    sock = _bind(config.host, config.port)
    host, port = sock.getsockname()[:2]
    uv_config = uvicorn.Config(
        app,
        log_config=None,  # leave logging as the process set it up
        timeout_graceful_shutdown=config.graceful_timeout,
        server_header=False,
        lifespan="on",
    )
    server = DrainingServer(uv_config, state, report)
    state.on_failure = server.stop
    url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    log.info("listening on %s", url)
    report(f"listening on {url} (loading {len(state.specs)} model(s); /health says when ready)")
    uvicorn_log = logging.getLogger("uvicorn.error")
    uvicorn_log.addFilter(_forced_stop_cancellation)
    try:
        server.run(sockets=[sock])
    finally:
        uvicorn_log.removeFilter(_forced_stop_cancellation)
        sock.close()
    busy = state.stop_work()
    if state.load_error is not None:
        raise state.load_error
    status = 1 if state.cut_off else 0
    if not state.cut_off:
        report("stopped: every request answered")
    elif state.forced:
        report(f"stopped at once: {state.cut_off} request(s) not finished (answered 503)")
    else:
        report(
            f"stopped: {state.cut_off} request(s) not finished within graceful_timeout "
            "(answered 503)"
        )
    if busy and exit_when_busy:
        log.info("a thread still computes (a forward pass, or loading): leaving without it")
        _leave(status)
    return status


def _leave(status: int) -> NoReturn:
    """End the process now with ``status``, skipping the interpreter's finalization.

    Why not a normal exit: a batch worker still inside a forward pass is a daemon thread in
    torch's C++ code, which releases the GIL for each operation and takes it back as the
    operation returns. Once the interpreter finalizes, a daemon thread that takes the GIL is
    ended with pthread_exit (Python 3.13 and before), whose unwinding cannot pass torch's C++
    frame (``THPVariable_matmul`` and the like, under ``PyEval_RestoreThread``): std::terminate,
    "terminate called without an active exception", SIGABRT and a core where exit status 1
    was promised. Waiting for the batch instead would take as long as
    a forward pass does, which nothing can interrupt, after a second signal that means now or
    a graceful_timeout already spent. ``os._exit`` ends every thread at once, and leaves
    nothing of the server undone: every request has its answer (200, or 503 if cut off), the
    listener is closed, and the server writes no files. What finalization would still do for
    the operator, flushing the log and the report lines, is done here first."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


class DrainingServer(uvicorn.Server):
    """A ``uvicorn.Server`` whose signals start a drain of the app's state and are not
    raised again once it is done (see the module docstring)."""

    def __init__(
        self, config: uvicorn.Config, state: ServerState, report: Callable[[str], None]
    ) -> None:
        super().__init__(config)
        self.state = state
        self.report = report

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        if threading.current_thread() is not threading.main_thread():
            yield  # signals reach the main thread only; a server on a thread is stopped
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame) -> None:
        name = signal.Signals(sig).name
        if self.should_exit:
            self.report(f"{name} again: stopping without waiting")
            self.state.forced = True
            self.force_exit = True
            return
        # Set before anything else: a second signal's handler can run inside this one (Python
        # runs handlers between bytecodes), and must see the first.
        self.should_exit = True
        self.state.begin_drain()
        self.report(f"{name}: draining, {self.state.in_flight} request(s) in flight")

    def stop(self) -> None:
        """Stop as on a signal (from any thread): used when the models fail to load."""
        self.should_exit = True


def _forced_stop_cancellation(record: logging.LogRecord) -> bool:
    """Drops uvicorn's error record of the lifespan task cancelled by a forced stop (a second
    signal skips the lifespan's shutdown, and the event loop's end cancels it; Starlette
    reports that as a failed shutdown with the traceback as its message): a stop the operator
    asked for, not an error."""
    error = record.exc_info[1] if record.exc_info else None
    if isinstance(error, asyncio.CancelledError):
        return False
    text = record.getMessage()
    return not (
        text.startswith("Traceback") and text.rstrip().endswith("asyncio.exceptions.CancelledError")
    )


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host``:``port`` (0: a free port), IPv4 or IPv6."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    # Not inherited (Python's default, kept): a child process, such as the compiler a kernel
    # build runs, must not hold the port after the server is gone.
    return sock
