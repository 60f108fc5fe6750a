"""Record points in the forward pass, for :mod:`clearformer.explain`.

Production code marks its steps with ``record("attn.scores", scores)``. With no recorder active
(the normal case) ``record`` returns at once: one global read, no tensor work, no state left on
any module. A recorder is activated only inside ``with recording(recorder):``; it receives the
step name, the live tensor, extra facts (such as a mask) and the caller's source line.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from torch import Tensor

__all__ = ["Recorder", "record", "recording", "is_recording"]


class Recorder(Protocol):
    def on_step(self, name: str, value: Tensor, meta: dict[str, Any], file: str, line: int): ...


_ACTIVE: Recorder | None = None


def is_recording() -> bool:
    return _ACTIVE is not None


def record(name: str, value: Tensor, **meta: Any) -> None:
    """Hand ``value`` to the active recorder, if any. Never changes ``value``."""
    if _ACTIVE is None:
        return
    caller = sys._getframe(1)
    _ACTIVE.on_step(name, value, meta, caller.f_code.co_filename, caller.f_lineno)


@contextmanager
def recording(recorder: Recorder) -> Iterator[Recorder]:
    """Activate ``recorder`` for the forward passes run inside the block (not re-entrant)."""
    global _ACTIVE
    if _ACTIVE is not None:
        raise RuntimeError("a recorder is already active; recordings cannot be nested")
    _ACTIVE = recorder
    try:
        yield recorder
    finally:
        _ACTIVE = None
