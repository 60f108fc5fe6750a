"""Independent forward passes side by side on the CPU's cores.

One large forward pass on all cores spends part of its time in work that does not split well
across threads: attention on short sequences, element-wise kernels (bias, GELU, LayerNorm,
residual adds) and the small matrix products of short batches, each a parallel region whose
threads wait for the slowest. Sentence encoding has many independent batches, so it can
instead run two batches at once, each on half of the threads. On the project's 2-core machine
this made ``TextEncoder.encode`` 8-15 % faster on all-MiniLM-L6-v2 than one batch on both cores
(``benchmarks/encode_throughput.py`` compares both); results are unchanged, since every batch
is computed alone.

PyTorch's intra-op thread count is per thread, but a new thread starts with the count most
recently set anywhere in the process, so :func:`batch_workers` restores the caller's count when
it is done.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

import torch

Item = TypeVar("Item")
Result = TypeVar("Result")

# Batches in flight at once. Two already keep both halves of the cores busy while one of them
# is in a poorly parallel kernel; more would multiply the activation memory for little gain.
AUTO_WORKERS = 2


def auto_workers(device: torch.device, batches: int) -> int:
    """How many batches to run side by side: ``AUTO_WORKERS`` on a CPU with at least as many
    intra-op threads and batches, else 1."""
    if device.type != "cpu" or batches < 2:
        return 1
    return max(1, min(AUTO_WORKERS, torch.get_num_threads(), batches))


def check_workers(workers: int | None) -> None:
    """Raise ValueError naming the argument when ``workers`` is not None or a positive int."""
    if workers is not None and (
        not isinstance(workers, int) or isinstance(workers, bool) or workers <= 0
    ):
        raise ValueError(f"workers must be a positive int or None, got {workers!r}")


def map_in_workers(
    fn: Callable[[Item], Result], items: Iterable[Item], workers: int
) -> Iterator[Result]:
    """``fn`` over ``items`` in order, ``workers`` calls at a time, the intra-op threads split
    between the workers. With ``workers=1`` it is a plain loop on the calling thread.

    Yields results in input order as they complete; at most ``2 * workers`` are pending, so
    memory stays bounded whatever the number of items.
    """
    if workers <= 1:
        yield from map(fn, items)
        return
    total = torch.get_num_threads()
    shares = iter(_split(total, workers))
    lock = threading.Lock()

    def start_worker() -> None:
        with lock:
            share = next(shares)
        torch.set_num_threads(share)

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


def _split(total: int, workers: int) -> list[int]:
    """``total`` threads shared by ``workers``, at least one each: 5 over 2 gives [3, 2]."""
    base, extra = divmod(total, workers)
    return [max(1, base + (1 if i < extra else 0)) for i in range(workers)]
