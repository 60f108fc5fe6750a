"""Faults the server must answer, not hide: a boolean in OpenAI's ``input`` named as such, a
sparse weight that JSON cannot write (500, not invalid JSON), a batch that fails outside the
model's forward pass (its requests rejected at once, the worker alive for the next), and a
batch failing after its request was given up (no exception left unread on its future)."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("prometheus_client")
pytest.importorskip("starlette")

from clearformer.serve.batcher import Batcher, Job  # noqa: E402
from clearformer.serve.errors import ApiError  # noqa: E402
from clearformer.serve.models import Prepared  # noqa: E402
from clearformer.serve.schemas import parse_embed, parse_openai_embeddings  # noqa: E402
from clearformer.serve.sparse import sparse_rows_body  # noqa: E402
from clearformer.serve.waiting import wait_for_rows  # noqa: E402

from .test_serve_batcher import Recorder, _inputs, running_batcher  # noqa: E402


def test_a_boolean_input_is_named_as_a_boolean_not_a_token_id():
    with pytest.raises(ApiError) as caught:
        parse_openai_embeddings({"input": ["a", True]})
    assert caught.value.message == "input[1] must be a string, got a boolean"
    assert caught.value.status == 422 and caught.value.param == "input"
    with pytest.raises(ApiError, match="token-id arrays are not accepted"):
        parse_openai_embeddings({"input": ["a", 3]})  # a real token id still is one


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"inputs": "a", "normalize": "yes"}, "normalize must be true or false, got 'yes'"),
        ({"inputs": "a", "truncate": 3}, "truncate must be true or false, got 3"),
        (
            {"inputs": "a", "truncate": "y" * 5_000},
            "truncate must be true or false, got a string of 5,000 characters",
        ),
        (
            {"inputs": "a", "truncate": -(10**3_999)},
            "truncate must be true or false, got an integer of 4,000 digits",
        ),
        (
            {"inputs": 10**3_999},
            "inputs must be a string or a list of strings, got an integer of 4,000 digits",
        ),
        (
            {"inputs": "a", "dimensions": -(10**50)},
            "dimensions must be a positive integer, got an integer of 51 digits",
        ),
        ({"inputs": 3}, "inputs must be a string or a list of strings, got a number (3)"),
    ],
)
def test_a_wrong_value_is_shown_in_its_message_but_never_at_length(body, message):
    with pytest.raises(ApiError) as caught:
        parse_embed(body)
    assert caught.value.message == message and caught.value.status == 422


def test_a_sparse_weight_json_cannot_write_is_a_500():
    rows = np.zeros((2, 5), dtype=np.float32)
    rows[1, 3] = np.nan
    with pytest.raises(ApiError) as caught:
        sparse_rows_body(rows)
    assert caught.value.status == 500 and "not finite" in caught.value.message
    assert "first at input 1" in caught.value.message
    rows[1, 3] = 0.5
    assert sparse_rows_body(rows) == b'[[],[{"index":3,"value":0.5}]]'


class FailingCpus:
    """A FreeCpus stand-in whose count fails while ``broken`` is set."""

    def __init__(self) -> None:
        self.broken = True

    def threads_for(self, wanted: int, total: int) -> int:
        if self.broken:
            raise OSError("cannot read /proc/stat")
        return wanted


def test_a_failure_outside_the_model_rejects_the_batch_and_the_worker_goes_on():
    model, cpus = Recorder(), FailingCpus()
    with running_batcher(model, workers=1, free_cpus=cpus) as batcher:

        async def main():
            loop = asyncio.get_running_loop()
            first = Job(model, Prepared(_inputs((1, 2)), "x"), loop)
            batcher.submit(first)
            with pytest.raises(OSError, match="proc/stat"):
                await asyncio.wait_for(first.future, 10)
            cpus.broken = False
            second = Job(model, Prepared(_inputs((2, 2)), "x"), loop)
            batcher.submit(second)
            return await asyncio.wait_for(second.future, 10)

        np.testing.assert_array_equal(asyncio.run(main()), [[2, 2]])


class WidthChanging(Recorder):
    """Rows one value wide in the first batch, two in the next: the write-back of a request
    spread over both fails."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def run(self, encodings, options):
        rows = super().run(encodings, options)
        if options == "x":
            self.calls += 1
            return rows[:, :1] if self.calls == 1 else rows
        return rows


def test_a_failing_write_back_rejects_the_request():
    model = WidthChanging()
    with running_batcher(model, workers=1, max_batch_tokens=2) as batcher:

        async def main():
            loop = asyncio.get_running_loop()
            job = Job(model, Prepared(_inputs((1, 2), (2, 2)), "x"), loop)  # two batches
            batcher.submit(job)
            with pytest.raises(ValueError):
                await asyncio.wait_for(job.future, 10)
            after = Job(model, Prepared(_inputs((3, 1)), "y"), loop)
            batcher.submit(after)
            return await asyncio.wait_for(after.future, 10)

        np.testing.assert_array_equal(asyncio.run(main()), [[3, 1]])


class FailsWhenLetGo(Recorder):
    def __init__(self) -> None:
        super().__init__()
        self.let_go = threading.Event()
        self.failed = threading.Event()

    def run(self, encodings, options):
        self.plugged.set()
        self.let_go.wait()
        self.failed.set()
        raise RuntimeError("the batch failed")


def test_a_batch_failing_after_its_request_timed_out_leaves_no_unread_exception(monkeypatch):
    # pytest keeps the batch's logged exception, which holds the job: asyncio would never see
    # the future go, nor log an unread exception on it.
    monkeypatch.setattr(logging.getLogger("clearformer.serve.batcher"), "propagate", False)
    model = FailsWhenLetGo()
    seen, jobs = [], []
    submit = Batcher.submit
    monkeypatch.setattr(Batcher, "submit", lambda self, job: (jobs.append(job), submit(self, job)))

    async def main():
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda loop, context: seen.append(context["message"]))
        never = asyncio.Event()

        async def receive():  # a client that stays
            await never.wait()

        request = SimpleNamespace(
            state=SimpleNamespace(admitted=None, deadline=time.monotonic() + 0.2),
            receive=receive,
        )
        with running_batcher(model, workers=1) as batcher:
            state = SimpleNamespace(batcher=batcher, config=SimpleNamespace(request_timeout=30))
            with pytest.raises(ApiError, match="not answered within"):
                await wait_for_rows(state, request, model, Prepared(_inputs((1, 2)), "x"))
            assert model.plugged.is_set()  # its batch was running when it timed out
            model.let_go.set()
            await loop.run_in_executor(None, model.failed.wait)
            await asyncio.sleep(0.1)  # the rejection, if any, reaches the loop
        # The workers are joined: nothing holds the job, and an unread exception is logged now.
        gc.collect()
        await asyncio.sleep(0)

    asyncio.run(main())
    assert model.failed.is_set()
    (job,) = jobs
    assert job.future.cancelled()  # given up: the failure set no exception on it
    del jobs[:], job
    gc.collect()
    assert not [m for m in seen if "never retrieved" in m], seen
