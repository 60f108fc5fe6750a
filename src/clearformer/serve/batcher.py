"""The dynamic batcher: inputs of many requests merged into forward passes under a token budget.

Requests put their tokenized inputs on one queue, in arrival order. Each batch worker (a thread
at its share of the CPU's threads, as ``encode``'s workers are) takes the next batch when it is
free: the oldest waiting input, then the inputs behind it that may share its forward pass (the
same model and options), until the next one would pass ``max_batch_tokens`` real tokens. So a
request waits for no timer, a lone request runs at once, and under load batches fill up. The
first input is always taken, even when it alone is over the budget: the queue can never stall
on an input larger than a batch.

With several workers, a worker's batch is also held to its fair share of the work: the tokens
queued and running, divided by the workers. One worker taking the whole queue would leave the
others to the requests that come back one at a time as its answers go out, each a batch of one,
and the workers stay that way: one serving nearly every client in large batches, the others
single requests. Shared, the workers' batches stay even and both grow with the load, and the
slowest answers come sooner (docs/serving.md).

Idle work goes to the first worker; the others take batches only while it is busy (or if it
has stopped on an error). A lone client's request (the only one queued, no worker running) is
not shared: the first worker takes it whole, up to the budget, and when nothing is left behind
it runs it on every thread of the process while the other workers wait for it to end, so a
lone request runs as fast as one request at a time would, not on a share of the CPU (nor split
between workers at one thread each, which was slower: docs/serving.md). Any other batch runs
on its worker's share, so busy workers never oversubscribe the CPU. Either count is cut to the
batch's part of the CPUs that other processes leave free (:class:`~clearformer.free_cpus.FreeCpus`,
unless the server runs with fixed threads): a thread on a CPU that another process keeps busy
stalls every parallel region of the pass (docs/serving.md). Lone requests stay on one
worker so that one pool of compute threads, not one per worker, grows to every thread. The
workers warm up one at a time: warmed side by side, the every-thread runs were measured
lastingly slower (docs/serving.md).

A request's inputs may be spread over several batches; its future resolves when its last row
is in. A row does not depend on its batch-mates (``TextEncoder.embed_batch``), so a request's
results are the same whatever else shares its batches. A cancelled request (its client gone, or
its time up) leaves the queue: its waiting inputs are dropped unrun.

The queue is bounded by admission, not here: the server admits at most
``max_concurrent_requests`` requests of at most ``max_client_batch_size`` inputs each.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..free_cpus import FreeCpus
from ..runtime import set_own_thread_count
from ..text.workers import thread_shares
from .metrics import ServerMetrics
from .models import Prepared, ServedModel

log = logging.getLogger(__name__)

# Waiting inputs of other models or options a worker looks past to fill a batch; beyond this
# it runs what it has (the queue's order is kept either way).
SCAN_LIMIT = 1024


class Closed(Exception):
    """The batcher takes no new work: the server is draining."""


class Job:
    """One request's inputs on their way through the batches; ``future`` gets the (n, width)
    float32 rows, in input order, on the event loop that made the job."""

    def __init__(
        self,
        model: ServedModel,
        prepared: Prepared,
        loop: asyncio.AbstractEventLoop,
        *,
        admitted: float | None = None,
    ) -> None:
        self.model = model
        self.encodings = prepared.encodings
        self.options = prepared.options
        self.key = (model.name, prepared.options)  # inputs with equal keys may share a batch
        self.loop = loop
        self.future: asyncio.Future = loop.create_future()
        self.rows: np.ndarray | None = None
        self.remaining = len(self.encodings)
        self.cancelled = False
        self.started = False  # its first batch has begun
        self.admitted = time.monotonic() if admitted is None else admitted  # the slot taken


@dataclass(frozen=True)
class _Input:
    job: Job
    index: int  # into job.encodings
    tokens: int


class Batcher:
    """The queue and the batch workers.

    Args:
        max_batch_tokens: real tokens per forward pass (an input over it runs alone).
        workers: batch workers, the intra-op threads split between them
            (:func:`~clearformer.text.workers.thread_shares`).
        metrics: where batches and the queue are recorded.
    """

    def __init__(
        self,
        *,
        max_batch_tokens: int,
        workers: int,
        metrics: ServerMetrics,
        free_cpus: FreeCpus | None = None,
    ) -> None:
        self.max_batch_tokens = max_batch_tokens
        self.workers = workers
        self.metrics = metrics
        # None: every batch on its full thread count, whatever else the machine runs.
        self.free_cpus = free_cpus
        self._queue: deque[_Input] = deque()
        self._queued_tokens = 0
        self._lock = threading.Lock()
        self._has_work = threading.Condition(self._lock)
        self._closing = False
        self._running = 0  # workers inside a batch
        self._running_tokens = 0  # their batches' tokens
        self._wide = False  # a batch runs on every thread: the other workers wait for it
        self._first_running = False  # the first worker is inside a batch: the others may work
        self._first_alive = True  # the first worker takes work (False: it stopped on an error)
        self._total_threads = 1
        self._threads: list[threading.Thread] = []
        self._warmed = 0
        # One warm-up at a time (see the module's docstring).
        self._warm_up_lock = threading.Lock()
        self._ready = threading.Event()
        self.warm_up_error: BaseException | None = None

    def start(self, models: Sequence[ServedModel]) -> None:
        """Start the workers. Each warms every model at its own thread count before it takes
        work; :meth:`wait_ready` returns once all have (or one failed: ``warm_up_error``)."""
        import torch

        total = torch.get_num_threads()
        self._total_threads = total
        shares = thread_shares(total, self.workers)
        started = [threading.Event() for _ in shares]
        for i, (share, event) in enumerate(zip(shares, started, strict=True)):
            thread = threading.Thread(
                target=self._work,
                args=(share, list(models), event, i),
                name=f"clearformer-serve-{i}",
                daemon=True,  # a batch in progress at exit is abandoned, not waited for
            )
            self._threads.append(thread)
            thread.start()
        for event in started:
            event.wait()
        # A new thread starts at the thread count last set anywhere in the process: the
        # workers' own counts are set, so give later threads the caller's back.
        torch.set_num_threads(total)

    def wait_ready(self, timeout: float | None = None) -> bool:
        return self._ready.wait(timeout)

    @property
    def queued(self) -> int:
        """Inputs waiting for a batch."""
        return len(self._queue)

    def submit(self, job: Job) -> None:
        """Queue a job's inputs. Raises :class:`Closed` while draining."""
        with self._lock:
            if self._closing:
                raise Closed("the server is shutting down")
            for index, encoding in enumerate(job.encodings):
                tokens = len(encoding.ids)
                self._queue.append(_Input(job, index, tokens))
                self._queued_tokens += tokens
            self._update_queue_metrics()
            # Every worker: which one may take the work depends on who is busy (_may_take).
            self._has_work.notify_all()

    def cancel(self, job: Job) -> None:
        """Drop a job's waiting inputs (its running ones finish, their rows unused)."""
        with self._lock:
            job.cancelled = True
            kept = deque(item for item in self._queue if item.job is not job)
            self._queued_tokens -= sum(i.tokens for i in self._queue if i.job is job)
            self._queue = kept
            self._update_queue_metrics()

    def retry_after(self) -> int:
        """Seconds a refused client should wait: the queue's tokens at the recent rate, 1 to
        60 (1 when nothing has run yet)."""
        rate = self.metrics.throughput()
        if rate <= 0:
            return 1
        return max(1, min(60, math.ceil(self._queued_tokens / rate)))

    def close(self) -> None:
        """Take no new jobs; the workers finish what is queued, then stop."""
        with self._lock:
            self._closing = True
            self._has_work.notify_all()

    def abandon(self) -> None:
        """Take no new jobs and drop every input still queued (their requests were answered:
        a forced stop, or a drain past its bound): each worker stops at the end of the batch it
        is in, none starts another."""
        with self._lock:
            self._closing = True
            for item in self._queue:
                item.job.cancelled = True
            self._queue.clear()
            self._queued_tokens = 0
            self._update_queue_metrics()
            self._has_work.notify_all()

    @property
    def busy(self) -> bool:
        """Whether a worker is inside a batch (a forward pass in torch's code)."""
        with self._lock:
            return self._running > 0

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the workers to stop; whether they all did."""
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self._threads)

    def _warm_up(self, models: list[ServedModel], share: int, index: int) -> None:
        for model in models:
            model.warm_up()
        if index == 0 and share != self._total_threads and self.workers > 1:
            # A lone batch runs on every thread (below): warm that count too, on this worker.
            set_own_thread_count(self._total_threads)
            for model in models:
                model.warm_up()
            set_own_thread_count(share)

    def _may_take(self, index: int) -> bool:
        """Whether worker ``index`` may take a batch now (the lock held)."""
        if self._wide or not self._queue:
            return False
        # The others also take work if the first worker has stopped on an error it did not
        # expect: the queue must never be left to nobody.
        return index == 0 or self._first_running or not self._first_alive

    def _work(
        self, share: int, models: list[ServedModel], started: threading.Event, index: int
    ) -> None:
        set_own_thread_count(share)
        started.set()
        try:
            with self._warm_up_lock:
                self._warm_up(models, share, index)
        except BaseException as exc:  # reported by the loader; the server does not start
            log.exception("warm-up failed")
            self.warm_up_error = exc
            self._ready.set()
            return
        with self._lock:
            self._warmed += 1
            if self._warmed == len(self._threads):
                self._ready.set()
        try:
            self._take_work(share, index)
        finally:
            if index == 0:
                with self._lock:
                    self._first_alive = False
                    self._has_work.notify_all()

    def _take_work(self, share: int, index: int) -> None:
        """Worker ``index``'s loop: take a batch, run it, until closed with nothing left."""
        threads = share
        while True:
            with self._lock:
                while not self._may_take(index) and not (self._closing and not self._queue):
                    self._has_work.wait()
                if not self._queue:
                    return  # closing, and nothing left
                # Its fair share of the work (the module's docstring), but for a lone client's
                # request: one job queued (its inputs are queued together) and none running.
                alive = self.workers - (0 if self._first_alive else 1)
                lone = self._running == 0 and self._queue[0].job is self._queue[-1].job
                budget = self.max_batch_tokens
                if alive > 1 and not lone:
                    work = self._queued_tokens + self._running_tokens
                    budget = min(budget, math.ceil(work / alive))
                batch = self._take_batch(budget)
                batch_tokens = sum(item.tokens for item in batch)
                self._running_tokens += batch_tokens
                # One request's inputs with nothing behind them (a lone client): every thread,
                # while the others wait. A batch of several requests' inputs means load.
                wide = (
                    self.workers > 1
                    and len({id(item.job) for item in batch}) == 1
                    and self._running == 0
                    and not self._queue
                )
                self._wide = wide
                self._running += 1
                if index == 0:
                    self._first_running = True
                    if self._queue and not wide:
                        self._has_work.notify_all()  # the others may take what is left
            try:
                wanted = self._total_threads if wide else share
                if self.free_cpus is not None:
                    wanted = self.free_cpus.threads_for(wanted, self._total_threads)
                if wanted != threads:
                    set_own_thread_count(wanted)
                    threads = wanted
                if batch:
                    self._run(batch)
            except Exception as exc:
                # Outside the forward pass (the thread count, the free CPUs, the rows' write-
                # back): the batch's requests are answered now (500), not at their timeout, and
                # the worker goes on to the next batch.
                log.exception("a batch of %d inputs failed outside the model", len(batch))
                self._fail(batch, exc)
            finally:
                with self._lock:
                    self._running -= 1
                    self._running_tokens -= batch_tokens
                    if wide:
                        self._wide = False
                    if index == 0:
                        self._first_running = False
                    if wide or index == 0:
                        self._has_work.notify_all()

    def _take_batch(self, budget: int) -> list[_Input]:
        """The next batch (the lock held): the oldest live input, then the inputs with its key
        behind it while the budget holds. Inputs of other keys keep their places."""
        taken: list[_Input] = []
        passed: list[_Input] = []
        tokens = 0
        while self._queue and len(passed) < SCAN_LIMIT:
            item = self._queue.popleft()
            if item.job.cancelled:
                self._queued_tokens -= item.tokens
                continue
            if taken and item.job.key != taken[0].job.key:
                passed.append(item)
                continue
            if taken and tokens + item.tokens > budget:
                self._queue.appendleft(item)
                break
            taken.append(item)
            tokens += item.tokens
            self._queued_tokens -= item.tokens
        self._queue.extendleft(reversed(passed))
        self._update_queue_metrics()
        now = time.monotonic()
        for item in taken:
            if not item.job.started:
                item.job.started = True
                self.metrics.queue_seconds.observe(now - item.job.admitted)
        return taken

    def _run(self, batch: list[_Input]) -> None:
        # Longest first, as encode orders its batches: equal lengths sit together, which the
        # packed attention runs in one piece each.
        batch = sorted(batch, key=lambda item: -item.tokens)
        first = batch[0].job
        encodings = [item.job.encodings[item.index] for item in batch]
        started = time.perf_counter()
        try:
            rows = first.model.run(encodings, first.options)  # (B, width)
            if not isinstance(rows, np.ndarray) or rows.ndim != 2 or len(rows) != len(batch):
                shape = getattr(rows, "shape", type(rows).__name__)
                raise RuntimeError(
                    f"the model returned rows of shape {shape} for a batch of {len(batch)} inputs"
                )
        except Exception as exc:
            log.exception("a batch of %d inputs failed", len(batch))
            self._fail(batch, exc)
            return
        tokens = sum(item.tokens for item in batch)
        self.metrics.batch_done(len(batch), tokens, time.perf_counter() - started)
        finished = []
        with self._lock:
            for item, row in zip(batch, rows, strict=True):
                job = item.job
                if job.cancelled:
                    continue
                if job.rows is None:
                    job.rows = np.empty((len(job.encodings), rows.shape[1]), dtype=rows.dtype)
                job.rows[item.index] = row
                job.remaining -= 1
                if job.remaining == 0:
                    finished.append(job)
        for job in finished:
            _call_soon(job, _resolve, job)

    def _fail(self, batch: list[_Input], exc: Exception) -> None:
        jobs = {id(item.job): item.job for item in batch}.values()
        for job in jobs:
            self.cancel(job)
            _call_soon(job, _reject, job, exc)

    def _update_queue_metrics(self) -> None:
        self.metrics.queue_depth.set(len(self._queue))
        self.metrics.queue_tokens.set(self._queued_tokens)


def _call_soon(job: Job, fn, *args: Any) -> None:
    # A closed loop (the server has stopped) has nobody waiting for this answer any more.
    with contextlib.suppress(RuntimeError):
        job.loop.call_soon_threadsafe(fn, *args)


def _resolve(job: Job) -> None:
    if not job.future.done():
        job.future.set_result(job.rows)


def _reject(job: Job, exc: Exception) -> None:
    # A done future is answered or given up by its waiter (waiting.wait_for_rows cancels it).
    if not job.future.done():
        job.future.set_exception(exc)
