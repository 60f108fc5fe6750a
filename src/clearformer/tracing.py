"""Record points in the forward pass, for :mod:`clearformer.explain`.

Production code marks its steps with ``record("attn.scores", scores)``. With no recorder active
(the normal case) ``record`` returns at once: one thread-local read, no tensor work, no state
left on any module. A recorder is activated only inside ``with recording(recorder):``, for the
calling thread only: another thread running the same model at the same time records nothing
into it. The recorder receives the step name, the live tensor, extra facts (such as a mask) and
the caller's source line.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from torch import Tensor

__all__ = ["Recorder", "record", "recording", "is_recording"]


class Recorder(Protocol):
    def on_step(self, name: str, value: Tensor, meta: dict[str, Any], file: str, line: int): ...


class _ThreadState(threading.local):
    recorder: Recorder | None = None


_STATE = _ThreadState()


def is_recording() -> bool:
    """Whether a recorder is active on the calling thread."""
    return _STATE.recorder is not None


def record(name: str, value: Tensor, **meta: Any) -> None:
    """Hand ``value`` to the calling thread's recorder, if any. Never changes ``value``."""
    recorder = _STATE.recorder
    if recorder is None:
        return
    caller = sys._getframe(1)
    recorder.on_step(name, value, meta, caller.f_code.co_filename, caller.f_lineno)


@contextmanager
def recording(recorder: Recorder) -> Iterator[Recorder]:
    """Activate ``recorder`` on the calling thread for the forward passes run inside the block
    (not re-entrant)."""
    if _STATE.recorder is not None:
        raise RuntimeError("a recorder is already active; recordings cannot be nested")
    _STATE.recorder = recorder
    try:
        yield recorder
    finally:
        _STATE.recorder = None
