"""What a long command says on stderr while it works: a line for each phase, and the progress
of the phase under way with its rate and the time it has left.

On a terminal the progress is one line redrawn in place (at most ten times a second), and a
phase's line is printed above it. Elsewhere (a log file, a CI job) redrawing would leave
hundreds of lines, so the progress is a line every few seconds, and a phase shorter than
that shows only its phase lines.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator

from ..text.progress import Throughput, describe_progress

REDRAW_EVERY = 0.1  # seconds between two redraws of a terminal's line
LINE_EVERY = 5.0  # seconds between two progress lines elsewhere
BAR_WIDTH = 24
PROGRESS_MIN_TEXTS = 256  # texts; below this, an encode's progress is not shown by default


class StatusLine:
    """Phase lines and progress on stderr (see the module docstring).

    Args:
        prefix: put before every line (``"index build"``).
        redraw: redraw one line in place (a terminal); None: when stderr is a terminal.
        show_progress: False keeps the phase lines and drops the progress.
    """

    def __init__(
        self,
        prefix: str,
        *,
        redraw: bool | None = None,
        show_progress: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.prefix = prefix
        self.redraw = _stderr_is_terminal() if redraw is None else redraw
        self.show_progress = show_progress
        self._clock = clock
        self._lock = threading.Lock()  # progress may come from a library's worker threads
        self._live = False  # a redrawn line is on the screen, not ended yet

    def line(self, text: str) -> None:
        """A line that stays (a phase begun or ended, a warning)."""
        with self._lock:
            self._end_live()
            print(f"{self.prefix}: {text}", file=sys.stderr, flush=True)

    def progress(self, what: str, unit: str) -> Callable[[int, int], None] | None:
        """A (done, total) callback that shows the progress of ``what`` in ``unit``; None
        when progress is not shown (so a library calls nothing, not even per item)."""
        if not self.show_progress:
            return None
        meter = Throughput(self._clock)
        every = REDRAW_EVERY if self.redraw else LINE_EVERY
        state = {"shown": self._clock()}

        def update(done: int, total: int) -> None:
            rate, left = meter.update(done, total)
            now = self._clock()
            finished = done >= total
            if now - state["shown"] < every and not (finished and self.redraw):
                return
            state["shown"] = now
            text = f"{what} {describe_progress(done, total, unit, rate, left)}"
            with self._lock:
                if self.redraw:
                    filled = int(BAR_WIDTH * done / max(total, 1))
                    bar = "#" * filled + "-" * (BAR_WIDTH - filled)
                    print(f"\r\033[K{self.prefix}: [{bar}] {text}", end="", file=sys.stderr)
                    sys.stderr.flush()
                    self._live = True
                    if finished:
                        self._end_live()
                else:
                    print(f"{self.prefix}: {text}", file=sys.stderr, flush=True)

        return update

    def close(self) -> None:
        with self._lock:
            self._end_live()

    def _end_live(self) -> None:
        if self._live:
            print(file=sys.stderr, flush=True)
            self._live = False


class _PhaseHandler(logging.Handler):
    def __init__(self, status: StatusLine) -> None:
        super().__init__(logging.INFO)
        self.status = status

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            if record.levelno >= logging.WARNING:
                message = f"{record.levelname.lower()}: {message}"
            self.status.line(message)
        except Exception:  # noqa: BLE001 -- logging's contract: a handler never raises
            self.handleError(record)


@contextlib.contextmanager
def phases_from(logger_name: str, status: StatusLine, verbose: bool) -> Iterator[None]:
    """A library's INFO lines (``logger_name`` and below: the phases of its work) shown as
    ``status`` lines while the block runs. With ``-v`` every log line is shown already, by the
    root logger's handler, and nothing is added."""
    if verbose:
        yield
        return
    logger = logging.getLogger(logger_name)
    handler = _PhaseHandler(status)
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # the root's handler would show the lines again, differently
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate
        status.close()


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # closed or replaced by an object without a tty
        return False


def progress_for(args, total: int):
    """The ``progress`` an ``encode`` call of ``total`` texts takes from a command with
    ``--progress``: a line on stderr with the texts done, their rate and the time left
    (:meth:`StatusLine.progress`), or False. Shown with ``--progress``, and by default when
    stderr is a terminal and the run has :data:`PROGRESS_MIN_TEXTS` texts or more (a bar for a
    run of a second is noise). The line ends when the work reaches ``total``; work that may stop
    short of it takes :func:`encode_progress`."""
    status = _encode_status(args, total)
    return False if status is None else status.progress("embedding", "texts")


@contextlib.contextmanager
def encode_progress(args, total: int) -> Iterator[Callable[[int, int], None] | bool]:
    """:func:`progress_for`'s ``progress`` for the block, its line ended when the block ends
    however it ends (an error, a resumed run that reuses its last chunks): the next message
    starts a line of its own."""
    status = _encode_status(args, total)
    if status is None:
        yield False
        return
    try:
        yield status.progress("embedding", "texts") or False
    finally:
        status.close()


def _encode_status(args, total: int) -> StatusLine | None:
    show = args.progress
    if show is None:
        show = _stderr_is_terminal() and total >= PROGRESS_MIN_TEXTS
    if not show:
        return None
    # Redrawn in place, also off a terminal when --progress asks for it (as index's bar is).
    return StatusLine(getattr(args, "command", None) or "encode", redraw=True)
