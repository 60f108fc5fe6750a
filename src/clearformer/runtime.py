"""Runtime settings a long-running command may choose for itself (never set on import): the
allocator's, process-wide, and a thread's own intra-op thread count; whether a graph is
being captured (compiled, exported or traced) around the running call; and the generator of
dropout's masks in the running context (:func:`counter_masks`)."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

log = logging.getLogger(__name__)

_COUNTER_MASKS: ContextVar[bool] = ContextVar("clearformer_counter_masks", default=False)


@contextmanager
def counter_masks(enabled: bool = True) -> Iterator[None]:
    """Dropout inside this block draws its masks from the counter-based generator where the
    kernel can take the tensor (:mod:`clearformer.dropout`; ``enabled=False``: PyTorch's, as
    outside)."""
    token = _COUNTER_MASKS.set(enabled)
    try:
        yield
    finally:
        _COUNTER_MASKS.reset(token)


def counter_masks_enabled() -> bool:
    """Whether the calling context asked for counter-based masks (:func:`counter_masks`)."""
    return _COUNTER_MASKS.get()


_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4


def retain_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed memory instead of returning it to the system.

    With the default settings every large temporary is a fresh ``mmap`` whose pages fault in
    again on each call; on ragged batches that cost dominated and made timings swing 3-10x.
    Returns True when the settings were applied (glibc on Linux), False elsewhere.
    """
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    ok = mallopt(_M_MMAP_MAX, 0) == 1 and mallopt(_M_TRIM_THRESHOLD, 2 * 1024**3) == 1
    log.debug("glibc malloc retains freed memory: %s", ok)
    return ok


def release_freed_memory() -> bool:
    """Hand the pages of memory freed so far back to the system (glibc's ``malloc_trim``),
    whatever :func:`retain_freed_memory` asked: for a step that has just freed a large part of
    what it holds and will not need it again soon (each float32 layer of an int8 load, once
    converted), so that the process's peak is what it holds, not what it has freed. Returns
    True when glibc released something, False elsewhere or when nothing was free."""
    trim = getattr(_libc(), "malloc_trim", None)
    return bool(trim(0)) if trim is not None else False


@functools.cache
def _libc():
    """glibc, loaded once (finding it runs ``ldconfig``); None off Linux or without it."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def set_own_thread_count(count: int) -> None:
    """Set the calling thread's PyTorch intra-op thread count to ``count``.

    A new thread takes its count from the process-wide value lazily, at its first query or
    parallel op, which would overwrite a count set before: query first, then set. Setting it
    also makes ``count`` what later new threads of the process start with, which is why the
    callers that start such threads restore their own count afterwards.
    """
    import torch

    torch.get_num_threads()
    torch.set_num_threads(count)


def capturing_graph() -> bool:
    """A compiler, exporter or TorchScript tracer is recording the call (``torch.compile``,
    ``torch.export``, ONNX export, ``torch.jit.trace``): it needs PyTorch's own ops, and a
    graph whose shape does not depend on the traced inputs' sizes."""
    import torch

    return torch.compiler.is_compiling() or torch.jit.is_tracing() or torch.onnx.is_in_onnx_export()
