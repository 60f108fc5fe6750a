"""What ran: each implementation a layer's call took, noted as it runs, for the check that a
call runs what its plan says.

The kernels and the fused linear layers call :func:`note` with what they are running (the
attention kernel or varlen method, the product's route). With no watcher active (the normal
case) ``note`` returns at once: one thread-local read. ``with watching() as ran:`` collects the
calling thread's notes, in order, as ``(what, choice)`` pairs (``tests/test_plan_ran.py``
holds them against the plan).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["note", "watching"]


class _ThreadState(threading.local):
    notes: list[tuple[str, str]] | None = None


_STATE = _ThreadState()


def note(what: str, choice: str) -> None:
    """Note that ``what`` (``attention``, ``linear``) ran as ``choice`` on the calling thread,
    where a watcher is active."""
    notes = _STATE.notes
    if notes is not None:
        notes.append((what, choice))


@contextmanager
def watching() -> Iterator[list[tuple[str, str]]]:
    """Collect the calling thread's notes while the block runs (not re-entrant)."""
    if _STATE.notes is not None:
        raise RuntimeError("a watcher is already active on this thread")
    _STATE.notes = []
    try:
        yield _STATE.notes
    finally:
        _STATE.notes = None
