"""The dynamic batcher on its own, with a stand-in model that records its batches: batches
follow the queue's order under the token budget, only inputs with equal options share one, an
input over the budget runs alone (the queue never stalls on it), a cancelled request's inputs
never run, and a request's rows come back in its own order whatever its batches were."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("prometheus_client")

from clearformer.serve.batcher import Batcher, Closed, Job  # noqa: E402
from clearformer.serve.metrics import ServerMetrics  # noqa: E402
from clearformer.serve.models import Prepared  # noqa: E402

PLUG = 0  # the first id of the input that holds the worker while a test fills the queue


class Recorder:
    """A model stand-in: a row is (the input's first id, its length); every batch waits for
    ``go`` and is recorded as the first ids of its inputs (the plug's batch is not)."""

    name = "recorder"

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.go = threading.Event()
        self.go.set()
        self.plugged = threading.Event()

    def warm_up(self) -> None:
        pass

    def run(self, encodings, options):
        if encodings[0].ids[0] == PLUG:
            self.plugged.set()
        self.go.wait()
        firsts = [e.ids[0] for e in encodings]
        if firsts != [PLUG]:
            self.batches.append(firsts)
        return np.float32([[e.ids[0], len(e.ids)] for e in encodings])


def _inputs(*lengths_and_ids: tuple[int, int]) -> list:
    return [SimpleNamespace(ids=[first] * length) for first, length in lengths_and_ids]


async def _plug(batcher: Batcher, model: Recorder) -> Job:
    """Hold the (one) worker in a batch of its own, so the test's requests queue up whole."""
    model.go.clear()
    model.plugged.clear()
    plug = Job(model, Prepared(_inputs((PLUG, 1)), "plug"), asyncio.get_running_loop())
    batcher.submit(plug)
    await asyncio.get_running_loop().run_in_executor(None, model.plugged.wait)
    return plug


def _run(batcher: Batcher, model: Recorder, requests: list[tuple[list, object]]) -> list:
    """Submit every request while the worker is held, then release it; the rows of each."""

    async def main():
        loop = asyncio.get_running_loop()
        plug = await _plug(batcher, model)
        jobs = [Job(model, Prepared(enc, options), loop) for enc, options in requests]
        for job in jobs:
            batcher.submit(job)
        model.go.set()
        await plug.future
        return [await job.future for job in jobs]

    return asyncio.run(main())


async def _until(condition, seconds: float = 5.0) -> None:
    """Wait for ``condition`` a bounded time; the test's assertions tell if it never came."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not condition() and loop.time() < deadline:
        await asyncio.sleep(0.001)


@contextlib.contextmanager
def running_batcher(model: Recorder, *, workers: int, max_batch_tokens: int = 10, free_cpus=None):
    """An batcher started on ``model`` and warmed; closed, its workers joined, on leaving."""
    batcher = Batcher(
        max_batch_tokens=max_batch_tokens,
        workers=workers,
        metrics=ServerMetrics(),
        free_cpus=free_cpus,
    )
    batcher.start([model])
    try:
        assert batcher.wait_ready(30)
        yield batcher
    finally:
        batcher.close()
    assert batcher.join(30)


@pytest.fixture
def batcher_and_model():
    model = Recorder()
    with running_batcher(model, workers=1) as batcher:
        yield batcher, model


def test_batches_take_the_queue_in_order_within_the_budget(batcher_and_model):
    batcher, model = batcher_and_model
    a = _inputs((1, 4), (2, 4))
    b = _inputs((3, 4), (4, 1), (5, 9))
    rows = _run(batcher, model, [(a, "x"), (b, "x")])
    # 4 + 4 fit, 4 more would not; then 4 + 1 (9 next would pass 10); then 9 alone.
    assert model.batches == [[1, 2], [3, 4], [5]]
    np.testing.assert_array_equal(rows[0], [[1, 4], [2, 4]])
    np.testing.assert_array_equal(rows[1], [[3, 4], [4, 1], [5, 9]])


def test_only_inputs_with_equal_options_share_a_batch(batcher_and_model):
    batcher, model = batcher_and_model
    rows = _run(
        batcher,
        model,
        [(_inputs((1, 2)), "x"), (_inputs((2, 2)), "y"), (_inputs((3, 2)), "x")],
    )
    # The second request's options differ: the first batch passes over it, keeping its place.
    assert model.batches == [[1, 3], [2]]
    assert [r[0, 0] for r in rows] == [1, 2, 3]


def test_an_input_over_the_budget_runs_alone(batcher_and_model):
    batcher, model = batcher_and_model
    rows = _run(batcher, model, [(_inputs((7, 50), (8, 2)), "x")])
    assert model.batches == [[7], [8]]
    np.testing.assert_array_equal(rows[0], [[7, 50], [8, 2]])


def test_a_cancelled_requests_waiting_inputs_never_run(batcher_and_model):
    batcher, model = batcher_and_model

    async def main():
        loop = asyncio.get_running_loop()
        plug = await _plug(batcher, model)
        gone = Job(model, Prepared(_inputs((2, 3), (3, 3)), "x"), loop)
        after = Job(model, Prepared(_inputs((4, 3)), "x"), loop)
        batcher.submit(gone)
        batcher.submit(after)
        assert batcher.queued == 3
        batcher.cancel(gone)
        assert batcher.queued == 1
        model.go.set()
        await plug.future
        await after.future
        return gone

    gone = asyncio.run(main())
    assert not gone.future.done()
    assert model.batches == [[4]]


def test_a_closed_batcher_takes_no_work_and_its_workers_stop():
    model = Recorder()
    batcher = Batcher(max_batch_tokens=10, workers=2, metrics=ServerMetrics())
    batcher.start([model])
    assert batcher.wait_ready(30)
    batcher.close()
    assert batcher.join(30)

    async def main():
        job = Job(model, Prepared(_inputs((1, 2)), "x"), asyncio.get_running_loop())
        with pytest.raises(Closed):
            batcher.submit(job)

    asyncio.run(main())


def test_a_failing_batch_fails_its_requests_only(batcher_and_model):
    batcher, model = batcher_and_model

    class Broken(Recorder):
        name = "broken"

        def run(self, encodings, options):
            raise RuntimeError("the model broke")

    broken = Broken()

    async def main():
        loop = asyncio.get_running_loop()
        bad = Job(broken, Prepared(_inputs((1, 2)), "x"), loop)
        good = Job(model, Prepared(_inputs((2, 2)), "x"), loop)
        batcher.submit(bad)
        batcher.submit(good)
        with pytest.raises(RuntimeError, match="the model broke"):
            await bad.future
        return await good.future

    np.testing.assert_array_equal(asyncio.run(main()), [[2, 2]])


def test_rows_are_written_exactly_and_nan_is_refused():
    import json

    from clearformer.serve.errors import ApiError
    from clearformer.serve.render import embed_body

    rng = np.random.default_rng(0)
    rows = (rng.standard_normal((3, 7)) * 10.0 ** rng.integers(-8, 3, (3, 7))).astype(np.float32)
    rows[0, 0] = -0.0
    back = np.float32(json.loads(embed_body(rows)))
    np.testing.assert_array_equal(back.view(np.uint32), rows.view(np.uint32))  # every bit
    rows[2, 3] = np.nan
    with pytest.raises(ApiError, match="results of 1 of 3 inputs are not finite"):
        embed_body(rows)


class ThreadRecorder(Recorder):
    """Records each batch's intra-op thread count, and the thread counts of every batch that
    ran at the same time (their sum must never pass the process's threads)."""

    # A warm-up long enough that two workers' would overlap, were they run side by side.
    WARM_UP_SECONDS = 0.05

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[int] = []
        self.workers: list[str] = []  # the thread that ran each batch
        self.overlaps: list[int] = []
        self.warm_ups: list[tuple[str, float, float]] = []  # (worker, start, end)
        self._active: list[int] = []
        self._lock = threading.Lock()

    def warm_up(self) -> None:
        import time

        start = time.monotonic()
        time.sleep(self.WARM_UP_SECONDS)
        with self._lock:
            self.warm_ups.append((threading.current_thread().name, start, time.monotonic()))

    def run(self, encodings, options):
        import torch

        mine = torch.get_num_threads()
        with self._lock:
            self._active.append(mine)
            self.overlaps.append(sum(self._active))
        try:
            rows = super().run(encodings, options)
            if encodings[0].ids[0] != PLUG:
                self.threads.append(mine)
                self.workers.append(threading.current_thread().name)
            return rows
        finally:
            with self._lock:
                self._active.remove(mine)


@pytest.fixture
def two_workers_on_two_threads():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    model = ThreadRecorder()
    with running_batcher(model, workers=2, max_batch_tokens=4) as batcher:
        yield batcher, model
    torch.set_num_threads(before)


def test_a_lone_request_runs_on_every_thread(two_workers_on_two_threads):
    batcher, model = two_workers_on_two_threads

    async def main():
        loop = asyncio.get_running_loop()
        for first in (1, 2, 3):  # one after another, as one client sends them
            job = Job(model, Prepared(_inputs((first, 2)), "x"), loop)
            batcher.submit(job)
            await job.future

    asyncio.run(main())
    assert model.threads == [2, 2, 2]
    assert max(model.overlaps) <= 2
    # Always the first worker: one pool of compute threads for every lone input.
    assert model.workers == ["clearformer-serve-0"] * 3


class _OthersBusy:
    """A FreeCpus whose reading says other processes keep ``busy`` of 2 CPUs busy."""

    def __init__(self, busy: float) -> None:
        from clearformer.free_cpus import FreeCpus

        self.free = FreeCpus(2, read=lambda: None)
        self.free._others = busy


@pytest.mark.parametrize(("busy", "threads"), [(0.0, 2), (0.4, 2), (1.0, 1), (1.9, 1)])
def test_a_lone_request_takes_only_the_cpus_others_leave_free(busy, threads):
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    model = ThreadRecorder()
    try:
        with running_batcher(
            model, workers=2, max_batch_tokens=4, free_cpus=_OthersBusy(busy).free
        ) as batcher:

            async def main():
                job = Job(model, Prepared(_inputs((1, 2)), "x"), asyncio.get_running_loop())
                batcher.submit(job)
                await job.future

            asyncio.run(main())
    finally:
        torch.set_num_threads(before)
    assert model.threads == [threads]


def test_a_lone_request_of_several_inputs_runs_whole_on_every_thread(two_workers_on_two_threads):
    batcher, model = two_workers_on_two_threads

    async def main():
        job = Job(model, Prepared(_inputs((1, 2), (2, 2)), "x"), asyncio.get_running_loop())
        batcher.submit(job)
        return await job.future

    rows = asyncio.run(main())
    # A lone client's request is not split into fair shares: one batch, every thread.
    assert model.batches == [[1, 2]]
    assert model.threads == [2]
    assert model.workers == ["clearformer-serve-0"]
    assert rows[:, 0].tolist() == [1, 2]


def test_a_lone_request_over_the_budget_is_shared_by_the_workers(two_workers_on_two_threads):
    batcher, model = two_workers_on_two_threads

    async def main():
        model.go.clear()  # each batch waits: the two run side by side, neither ends first
        job = Job(model, Prepared(_inputs((1, 2), (2, 2), (3, 2)), "x"), asyncio.get_running_loop())
        batcher.submit(job)
        await _until(lambda: len(model.overlaps) >= 2)
        model.go.set()
        return await job.future

    rows = asyncio.run(main())
    # 6 tokens, a 4-token budget: the first batch leaves work behind, so it runs on its
    # worker's share and the other worker takes the rest, side by side.
    assert sorted(model.batches) == [[1, 2], [3]]
    assert model.threads == [1, 1]
    assert sorted(model.workers) == ["clearformer-serve-0", "clearformer-serve-1"]
    assert rows[:, 0].tolist() == [1, 2, 3]


class HeldRecorder(ThreadRecorder):
    """Every batch but the plug's waits for ``hold``: batches taken one after another stay
    running side by side, as real batches (milliseconds long) do."""

    def __init__(self) -> None:
        super().__init__()
        self.hold = threading.Event()
        self.held = 0  # batches waiting for hold

    def run(self, encodings, options):
        if encodings[0].ids[0] != PLUG:
            with self._lock:
                self.held += 1
            self.hold.wait()
        return super().run(encodings, options)


def test_queued_work_is_shared_by_the_workers_not_taken_whole():
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    model = HeldRecorder()

    async def main(batcher):
        loop = asyncio.get_running_loop()
        plug = await _plug(batcher, model)  # on both threads: the other worker waits
        jobs = [Job(model, Prepared(_inputs((i, 2)), "x"), loop) for i in range(1, 9)]
        for job in jobs:
            batcher.submit(job)
        model.go.set()
        await plug.future
        await _until(lambda: model.held >= 2)
        model.hold.set()
        return [await job.future for job in jobs]

    try:
        with running_batcher(model, workers=2, max_batch_tokens=100) as batcher:
            rows = asyncio.run(main(batcher))
    finally:
        torch.set_num_threads(before)
    # The budget would take all eight requests (16 tokens) in one batch. Shared: the first
    # free worker takes half of the work queued and running (8 tokens), the other worker the
    # rest (8 queued + 8 running, halved).
    assert sorted(model.batches) == [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert model.threads == [1, 1]
    assert max(model.overlaps) <= 2
    assert [r[0, 0] for r in rows] == list(range(1, 9))


class WrongRows(Recorder):
    """Returns one row too many for its first batch."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def run(self, encodings, options):
        self.calls += 1
        rows = super().run(encodings, options)
        return np.concatenate([rows, rows[:1]]) if self.calls == 1 else rows


def test_a_model_returning_the_wrong_rows_fails_its_request_and_the_batcher_goes_on():
    model = WrongRows()

    async def main(batcher):
        loop = asyncio.get_running_loop()
        bad = Job(model, Prepared(_inputs((1, 2)), "x"), loop)
        batcher.submit(bad)
        with pytest.raises(RuntimeError, match="rows of shape \\(2, 2\\) for a batch of 1"):
            await asyncio.wait_for(bad.future, 10)
        good = Job(model, Prepared(_inputs((2, 2)), "x"), loop)
        batcher.submit(good)
        return await asyncio.wait_for(good.future, 10)

    with running_batcher(model, workers=2) as batcher:
        assert asyncio.run(main(batcher))[0, 0] == 2


# The first worker's thread ends on the exception: that is the case under test.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_work_goes_on_if_the_first_worker_stops(monkeypatch):
    model = Recorder()
    batcher = Batcher(max_batch_tokens=10, workers=2, metrics=ServerMetrics())
    real_run = batcher._run

    def run(batch):
        if threading.current_thread().name == "clearformer-serve-0":
            raise KeyboardInterrupt  # not an Exception: nothing inside the worker catches it
        real_run(batch)

    monkeypatch.setattr(batcher, "_run", run)
    batcher.start([model])
    assert batcher.wait_ready(30)

    async def main():
        loop = asyncio.get_running_loop()
        batcher.submit(Job(model, Prepared(_inputs((1, 2)), "x"), loop))  # lost with worker 0
        for _ in range(1000):
            if not batcher._threads[0].is_alive():
                break
            await asyncio.sleep(0.01)
        later = Job(model, Prepared(_inputs((2, 2)), "x"), loop)
        batcher.submit(later)
        return await asyncio.wait_for(later.future, 10)

    assert asyncio.run(main())[0, 0] == 2  # the second worker took it
    batcher.close()
    assert batcher.join(30)


def test_workers_warm_up_one_at_a_time(two_workers_on_two_threads):
    _, model = two_workers_on_two_threads
    # Two workers, the first warming at its share and at every thread: three warm-ups.
    spans = sorted((start, end) for _, start, end in model.warm_ups)
    assert len(spans) == 3
    assert all(later[0] >= earlier[1] for earlier, later in zip(spans, spans[1:], strict=False))


def test_busy_workers_run_on_their_share_and_never_oversubscribe(two_workers_on_two_threads):
    batcher, model = two_workers_on_two_threads
    # The plug runs alone (on both threads); the requests behind it fill 4 batches (4 tokens
    # each, the budget): with work waiting, a worker takes its one-thread share, and the other
    # worker never starts while a batch runs on both threads.
    rows = _run(batcher, model, [(_inputs((i, 4)), "x") for i in range(1, 5)])
    assert sorted(b[0] for b in model.batches) == [1, 2, 3, 4]
    assert model.threads[0] == 1  # three more were waiting behind the first
    assert max(model.overlaps) <= 2
    assert [r[0, 0] for r in rows] == [1, 2, 3, 4]


def test_abandon_drops_the_queue_and_the_workers_end_after_their_batch(batcher_and_model):
    """A forced stop: the inputs still queued never run, the batch running ends, and then
    every worker stops, busy no more."""
    batcher, model = batcher_and_model

    async def main():
        loop = asyncio.get_running_loop()
        plug = await _plug(batcher, model)
        queued = Job(model, Prepared(_inputs((1, 2), (2, 2)), "x"), loop)
        batcher.submit(queued)
        assert batcher.busy and batcher.queued == 2
        batcher.abandon()
        assert batcher.queued == 0 and batcher.busy  # the plug's batch is still running
        with pytest.raises(Closed):
            batcher.submit(Job(model, Prepared(_inputs((3, 1)), "x"), loop))
        model.go.set()
        await plug.future  # its rows still come
        return queued

    queued = asyncio.run(main())
    assert batcher.join(30) and not batcher.busy
    assert model.batches == [] and not queued.future.done()  # its inputs never ran
