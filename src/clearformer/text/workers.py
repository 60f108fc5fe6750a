"""Independent forward passes side by side on the CPU's cores (``encode(workers=N)``).

One large forward pass on all cores spends part of its time in work that does not split well
across threads: attention, element-wise kernels (bias, GELU, LayerNorm, residual adds) and the
small matrix products of short batches, each a parallel region whose threads wait for the
slowest. Sentence encoding has many independent batches, so it can instead run several at once,
each on a share of the threads.

With the linear layers fused (fewer element-wise passes) two passes side by side, one thread
each, were faster than one pass on both threads on sentence-length texts and on long ones
(measurements in docs/performance.md, "Encoding texts"), so ``encode`` runs two at a time on
a CPU by default (:func:`auto_workers`); ``workers=1`` runs one batch at a time.

PyTorch's intra-op thread count is per thread, but a new thread starts with the count most
recently set anywhere in the process, so :func:`map_in_workers` restores the caller's count when
it is done. Every batch is computed alone, so results are equal within float rounding (a thread
count can change how a kernel splits its sums; tested to 1e-6).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

import torch

from ..checks import check_positive_int
from ..runtime import set_own_thread_count
from ..tracing import is_recording

Item = TypeVar("Item")
Result = TypeVar("Result")


def auto_workers(batches: int, device: torch.device) -> int:
    """Workers ``encode(workers=None)`` uses for ``batches`` forward passes on ``device``: two
    on a CPU where PyTorch has at least two intra-op threads and there are at least two
    batches, else one. One while a trace records (a recorder sees its own thread only) and
    off the CPU (a GPU runs one pass at a time anyway)."""
    if device.type != "cpu" or batches < 2 or torch.get_num_threads() < 2 or is_recording():
        return 1
    return 2


def check_workers(workers: int | None) -> None:
    """Raise unless ``workers`` is None or a positive int, and 1 while a trace records: a
    recorder sees its own thread's steps only, so batches run on worker threads would be
    missing from the trace, and the calling thread's share would be out of order."""
    if workers is None:
        return
    check_positive_int(workers, "workers")
    if workers > 1 and is_recording():
        raise ValueError(f"workers must be 1 while a trace is recording (explain), got {workers}")


def map_in_workers(
    fn: Callable[[Item], Result], items: Sequence[Item], workers: int
) -> Iterator[Result]:
    """``fn`` over ``items`` in order, ``workers`` calls at a time, the intra-op threads split
    between the workers. With ``workers=1`` it is a plain loop on the calling thread.

    Items run in rounds of ``workers``. The last ``len(items) % workers`` items, which would
    leave part of the cores idle, run afterwards on the calling thread with all its threads.
    Yields results in input order; at most ``2 * workers`` are pending, so memory stays bounded
    whatever the number of items.
    """
    shared = len(items) - len(items) % workers if workers > 1 else 0
    if shared:
        yield from _in_pool(fn, items[:shared], workers)
    yield from map(fn, items[shared:])


def _in_pool(fn: Callable[[Item], Result], items: Sequence[Item], workers: int) -> Iterator[Result]:
    total = torch.get_num_threads()
    shares = iter(thread_shares(total, workers))
    lock = threading.Lock()

    def start_worker() -> None:
        with lock:
            share = next(shares)
        set_own_thread_count(share)

    pool = ThreadPoolExecutor(
        workers, thread_name_prefix="clearformer-batch", initializer=start_worker
    )
    pending: list[Future[Result]] = []
    source = iter(items)
    try:
        for item in itertools.islice(source, 2 * workers):
            pending.append(pool.submit(fn, item))
        while pending:
            result = pending.pop(0).result()
            for item in itertools.islice(source, 1):
                pending.append(pool.submit(fn, item))
            yield result
    finally:
        for future in pending:
            future.cancel()
        pool.shutdown(wait=True)
        torch.set_num_threads(total)  # the count new threads start with, as the caller had it


def run_at_worker_shares(fn: Callable[[], object], workers: int = 2) -> None:
    """Call ``fn`` once on a thread of its own for each thread count ``workers`` workers would
    run at (besides the caller's own count), then restore what new threads start with.

    Compiled code (``torch.compile``) guards on the intra-op thread count: warmed up only at
    the caller's count, it would recompile inside the workers, each racing the other."""
    total = torch.get_num_threads()
    errors: list[BaseException] = []

    def run(share: int) -> None:
        set_own_thread_count(share)
        try:
            fn()
        except BaseException as exc:  # re-raised on the caller
            errors.append(exc)

    for share in sorted(set(thread_shares(total, workers)) - {total}):
        thread = threading.Thread(target=run, args=(share,), name="clearformer-warm-up")
        thread.start()
        thread.join()
        torch.set_num_threads(total)
        if errors:
            raise errors[0]


def thread_shares(total: int, workers: int) -> list[int]:
    """``total`` threads shared by ``workers``, at least one each: 5 over 2 gives [3, 2]. The
    counts ``encode``'s workers run at, and ``clearformer serve``'s batch workers too."""
    base, extra = divmod(total, workers)
    return [max(1, base + (1 if i < extra else 0)) for i in range(workers)]
