"""Packed attention with the sequences grouped per thread (varlen method ``threads``).

The ``sequence`` method makes one fused attention call per run of equally long sequences, and
each call is an OpenMP parallel region over all the cores: when other processes compete for
the cores, every region waits for its slowest, descheduled thread, and with 32 ragged sequences
per layer the waits add up (docs/performance.md). ``padded`` makes one region per layer, but
attends over padding.

``threads`` keeps one fused call per run and no padding, but opens no parallel region: the runs
are cut into as many contiguous groups as PyTorch has intra-op threads, balanced by their cost
(sequences x length²), and each group runs on a worker thread of its own whose PyTorch runs
single-threaded. A descheduled worker delays only its own group. The outputs are the same
calls' outputs, concatenated in row order.

With dropout on the probabilities the draws would come from one generator in an order that
depends on thread timing, so a training step with attention dropout takes ``sequence`` instead
(bitwise reproducible runs).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import Tensor

from ..runtime import set_own_thread_count

_POOLS: dict[int, ThreadPoolExecutor] = {}
_LOCK = threading.Lock()


def _forget_pools_in_child() -> None:
    # A forked child (a data-loader worker) inherits the pools but not their threads: work
    # submitted there would wait forever. It starts pools of its own.
    global _LOCK
    _POOLS.clear()
    _LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pools_in_child)


# Set when a worker thread has started: its set_num_threads(1) also became the count every
# later new thread of the process starts with, which the caller then restores.
_NEW_WORKERS = threading.Event()


def _single_threaded() -> None:
    set_own_thread_count(1)
    _NEW_WORKERS.set()


def _pool(workers: int) -> ThreadPoolExecutor:
    with _LOCK:
        if workers not in _POOLS:
            _POOLS[workers] = ThreadPoolExecutor(
                workers, thread_name_prefix="clearformer-varlen", initializer=_single_threaded
            )
        return _POOLS[workers]


def balanced_groups(runs: list[tuple[int, int, int]], groups: int) -> list[list[int]]:
    """Cut ``runs`` ((first row, sequences, length) each) into at most ``groups`` contiguous
    lists of run indices with about equal attention cost (sequences * length²)."""
    costs = [count * length * length for _, count, length in runs]
    total = sum(costs)
    out: list[list[int]] = [[]]
    done = 0.0
    for index, cost in enumerate(costs):
        # Start a new group once this one holds its share, keeping every group non-empty.
        if out[-1] and len(out) < groups and done >= total * len(out) / groups:
            out.append([])
        out[-1].append(index)
        done += cost
    return out


def threaded_attention(q, k, v, layout, is_causal, scale, window, bias, attend_runs) -> Tensor:
    """Packed attention with the runs of ``layout`` grouped per thread.

    ``attend_runs(q, k, v, runs)`` attends a contiguous stretch of runs on its own rows (the
    ``sequence`` method's body) and returns the runs' outputs as a list; this function only
    splits, dispatches and concatenates them all at once (one copy of the output, not one
    per worker and another of the workers' results).
    """
    runs = layout.runs
    threads = torch.get_num_threads()
    workers = min(threads, len(runs))
    if workers <= 1:
        pieces = attend_runs(q, k, v, runs)
        if not pieces:
            return v.new_zeros(0, q.shape[1], v.shape[2])
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=0)  # (N, H, Dv)
    groups = balanced_groups(runs, workers)
    # Rows of each group: from its first run's first row to the row after its last run.
    bounds = [(runs[g[0]][0], runs[g[-1]][0] + runs[g[-1]][1] * runs[g[-1]][2]) for g in groups]
    # Grad mode and inference mode are per thread: the workers take the caller's.
    grad, inference = torch.is_grad_enabled(), torch.is_inference_mode_enabled()

    def work(group: list[int], start: int, end: int) -> list[Tensor]:
        with torch.inference_mode(inference), torch.set_grad_enabled(grad):
            return attend_runs(q[start:end], k[start:end], v[start:end], [runs[i] for i in group])

    pool = _pool(workers)
    futures = [pool.submit(work, g, a, b) for g, (a, b) in zip(groups, bounds, strict=True)]
    pieces = [piece for future in futures for piece in future.result()]
    if _NEW_WORKERS.is_set():
        _NEW_WORKERS.clear()
        torch.set_num_threads(threads)  # what new threads start with, as the caller had it
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=0)  # (N, H, Dv)
