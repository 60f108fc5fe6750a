"""How ``TextEncoder.encode`` cuts texts into forward passes and runs them side by side."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from clearformer import TextEncoder
from clearformer.text.batching import balance_batches, plan_batches, text_cost
from clearformer.text.workers import map_in_workers

from .helpers import intra_op_threads
from .test_pretrained_minilm import LONG, TEXTS


@given(
    lengths=st.lists(st.integers(0, 300), max_size=60),
    max_tokens=st.integers(1, 2000),
)
def test_token_budget_plan_covers_every_text_once_within_budget(lengths, max_tokens):
    batches = plan_batches(lengths, None, max_tokens)
    flat = [i for batch in batches for i in batch]
    assert sorted(flat) == list(range(len(lengths)))
    # longest first, so each batch's first text sets its padded length
    assert [lengths[i] for i in flat] == sorted(lengths, reverse=True)
    for batch in batches:
        padded = len(batch) * max(lengths[i] for i in batch)
        assert padded <= max_tokens or len(batch) == 1


@given(lengths=st.lists(st.integers(0, 300), max_size=60), batch_size=st.integers(1, 10))
def test_batch_size_plan_has_fixed_batches(lengths, batch_size):
    batches = plan_batches(lengths, batch_size)
    assert [len(b) for b in batches[:-1]] == [batch_size] * (len(batches) - 1)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))


def test_token_budget_puts_short_texts_in_large_batches():
    lengths = [200] * 4 + [10] * 90
    batches = plan_batches(lengths, None, 900)
    assert [len(b) for b in batches] == [4, 90]


@given(
    lengths=st.lists(st.integers(0, 300), max_size=80),
    max_tokens=st.integers(1, 3000),
    workers=st.integers(1, 4),
)
def test_balanced_plan_keeps_the_order_and_the_budget_in_a_multiple_of_the_workers(
    lengths, max_tokens, workers
):
    greedy = plan_batches(lengths, None, max_tokens)
    balanced = balance_batches(lengths, greedy, workers, d_model=64, max_tokens=max_tokens)
    # The same texts in the same longest-first order, only cut elsewhere.
    assert [i for b in balanced for i in b] == [i for b in greedy for i in b]
    assert all(balanced)
    for batch in balanced:
        padded = len(batch) * max(lengths[i] for i in batch)
        assert padded <= max_tokens or len(batch) == 1
    if balanced is not greedy:
        assert len(balanced) % workers == 0
        assert len(greedy) <= len(balanced)
        assert len(balanced) <= max(5 * len(greedy) // 4, -(-len(greedy) // workers) * workers)


def _costs(lengths, batches, d_model=384):
    return [sum(text_cost(lengths[i], d_model) for i in batch) for batch in batches]


def test_balanced_plan_gives_two_workers_equal_work():
    # Sentence-like lengths: the budget-bound plan has three batches (two full, one short),
    # so a second worker would idle through the third.
    rng = np.random.default_rng(0)
    lengths = [int(n) for n in rng.integers(12, 40, size=300)]
    greedy = plan_batches(lengths, None, 4096)
    assert len(greedy) == 3
    balanced = balance_batches(lengths, greedy, 2, d_model=384)
    assert len(balanced) == 4
    costs = _costs(lengths, balanced)
    assert max(costs) / min(costs) < 1.03  # equal within about one text
    greedy_costs = _costs(lengths, greedy)
    assert max(greedy_costs) / min(greedy_costs) > 1.5  # what it replaces was far from it


def test_balanced_plan_counts_attention_in_long_texts():
    # 20 texts of 100 tokens and 100 of 20 carry the same real tokens (2,000 each), but the
    # long ones attend over five times the keys: they cost more, so an equal-cost cut gives
    # the long half fewer texts than an equal-token cut would.
    lengths = [100] * 20 + [20] * 100
    greedy = plan_batches(lengths, None, 20_000)
    assert len(greedy) == 1
    first, second = balance_batches(lengths, greedy, 2, d_model=384, max_tokens=20_000)
    assert len(first) < 20 and set(first) <= set(range(20))
    costs = _costs(lengths, [first, second])
    assert max(costs) / min(costs) < 1.06
    assert text_cost(100, 384) / text_cost(20, 384) > 100 / 20


def test_balanced_plan_leaves_a_plan_alone_when_there_is_nothing_to_balance():
    lengths = [10, 9, 8]
    greedy = plan_batches(lengths, None, 100)
    assert balance_batches(lengths, greedy, 1, d_model=384) is greedy  # one worker
    assert balance_batches(lengths, greedy, 4, d_model=384) is greedy  # fewer texts than workers
    # Texts that fill the budget one by one cannot be cut into fewer or cheaper batches.
    lengths = [100] * 3
    greedy = plan_batches(lengths, None, 100)
    assert balance_batches(lengths, greedy, 2, d_model=384, max_tokens=100) is greedy


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"workers": 0}, "workers must be a positive int, got 0"),
        ({"d_model": -1}, "d_model must be a positive int, got -1"),
        ({"max_tokens": 1.5}, "max_tokens must be a positive int, got 1.5"),
    ],
)
def test_balanced_plan_names_bad_arguments(kwargs, match):
    args = {"workers": 2, "d_model": 384, "max_tokens": 4096} | kwargs
    with pytest.raises(ValueError, match=match):
        balance_batches([3, 4], [[1, 0]], **args)


@pytest.mark.parametrize(
    ("batch_size", "max_tokens", "match"),
    [
        (0, 10, "batch_size must be a positive int or None, got 0"),
        (True, 10, "batch_size must be a positive int or None, got True"),
        (None, 0, "max_tokens must be a positive int, got 0"),
        (None, 2.5, "max_tokens must be a positive int, got 2.5"),
    ],
)
def test_bad_limits_are_named(batch_size, max_tokens, match):
    with pytest.raises(ValueError, match=match):
        plan_batches([3, 4], batch_size, max_tokens)


def test_auto_workers_takes_two_on_a_cpu_with_two_threads_and_two_batches():
    from clearformer.text.workers import auto_workers
    from clearformer.tracing import recording

    class Discard:
        def on_step(self, name, value, meta, file, line):
            pass

    cpu = torch.device("cpu")
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert auto_workers(2, cpu) == 2
        assert auto_workers(1, cpu) == 1  # one batch: all threads on it
        assert auto_workers(5, torch.device("meta")) == 1  # not a CPU
        with recording(Discard()):
            assert auto_workers(5, cpu) == 1  # a trace sees its own thread only
        torch.set_num_threads(1)
        assert auto_workers(5, cpu) == 1
    finally:
        torch.set_num_threads(before)


def test_map_in_workers_keeps_order_splits_threads_and_restores_the_count():
    before = torch.get_num_threads()
    seen = []

    def work(item):
        seen.append((threading.current_thread().name, torch.get_num_threads()))
        return item * item

    assert list(map_in_workers(work, range(20), workers=2)) == [i * i for i in range(20)]
    assert torch.get_num_threads() == before
    assert all(name.startswith("clearformer-batch") for name, _ in seen)
    assert {count for _, count in seen} <= {max(1, before // 2), max(1, before - before // 2)}
    # a thread started afterwards gets the caller's count again, not a worker's
    started = []
    thread = threading.Thread(target=lambda: started.append(torch.get_num_threads()))
    thread.start()
    thread.join()
    assert started == [before]


def test_map_in_workers_gives_each_worker_its_share_of_an_uneven_split():
    counts = {}
    # Each worker waits at its first item until the other has started too, so that both
    # take items (without it one worker could take all eight before the other starts).
    both_started = threading.Barrier(2, timeout=60)  # a timeout only so a hang fails

    def work(_):
        name = threading.current_thread().name
        if name not in counts:
            counts[name] = torch.get_num_threads()
            both_started.wait()

    with intra_op_threads(5):
        list(map_in_workers(work, range(8), workers=2))
        assert torch.get_num_threads() == 5
    assert sorted(counts.values()) == [2, 3]


def test_map_in_workers_runs_the_last_uneven_round_on_the_calling_thread():
    here = threading.current_thread().name
    names = list(map_in_workers(lambda _: threading.current_thread().name, range(5), workers=2))
    assert all(name.startswith("clearformer-batch") for name in names[:4])
    assert names[4] == here
    assert list(map_in_workers(lambda _: threading.current_thread().name, [0], 2)) == [here]


def test_map_in_workers_one_worker_runs_on_the_calling_thread():
    names = list(map_in_workers(lambda _: threading.current_thread().name, range(3), workers=1))
    assert names == [threading.current_thread().name] * 3


def test_map_in_workers_passes_errors_on_and_restores_the_count():
    before = torch.get_num_threads()

    def work(item):
        if item == 5:
            raise RuntimeError("item 5 failed")
        return item

    with pytest.raises(RuntimeError, match="item 5 failed"):
        list(map_in_workers(work, range(50), workers=2))
    assert torch.get_num_threads() == before


@pytest.fixture(scope="module")
def encoder() -> TextEncoder:
    return TextEncoder.from_pretrained()


def test_encode_same_result_for_every_plan_and_worker_count(encoder):
    texts = TEXTS * 4 + [LONG] * 3
    reference = np.stack([encoder.encode([t], workers=1)[0] for t in texts])
    for kwargs in (
        {"workers": 2, "max_tokens": 64},
        {"workers": 3, "max_tokens": 300},
        {"workers": 1, "max_tokens": 100_000},
        {"workers": 2, "batch_size": 3},
        {},
    ):
        got = encoder.encode(texts, **kwargs)
        np.testing.assert_array_equal(got, reference, err_msg=str(kwargs))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> TextEncoder:
    from .helpers import write_tiny_bert
    from .index_helpers import WORDS

    return TextEncoder.from_pretrained(
        write_tiny_bert(tmp_path_factory.mktemp("tiny-batching"), WORDS, n_layers=2)
    )


@given(
    lengths=st.lists(st.integers(1, 28), min_size=1, max_size=24),
    near=st.booleans(),
    batch_size=st.one_of(st.none(), st.integers(1, 9)),
    max_tokens=st.integers(30, 400),
)
def test_a_text_embeds_to_the_same_bits_in_any_batch(tiny, lengths, near, batch_size, max_tokens):
    # Nearly equal lengths make batches with a few per cent of padding, which `auto` alone would
    # run on the padded layout (attention over the padded length, with a mask).
    if near:
        lengths = [20 + (i % 7 == 0) for i in range(len(lengths))]
    texts = [" ".join(f"w{(i * 7 + j) % 60}" for j in range(n)) for i, n in enumerate(lengths)]
    # One thread: PyTorch's attention kernel may round otherwise at another thread count for
    # heads this narrow (8), and workers would change the thread count of each pass.
    with intra_op_threads(1):
        alone = np.concatenate([tiny.encode([t]) for t in texts])
        batched = tiny.encode(texts, batch_size=batch_size, max_tokens=max_tokens, workers=1)
    np.testing.assert_array_equal(batched, alone)


def test_encode_progress_counts_every_text_with_workers(encoder):
    calls = []
    encoder.encode(
        TEXTS, max_tokens=40, workers=2, progress=lambda done, total: calls.append((done, total))
    )
    assert calls[-1] == (len(TEXTS), len(TEXTS))
    assert [done for done, _ in calls] == sorted(done for done, _ in calls)
    assert len(calls) > 1


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"workers": 0}, "workers must be a positive int, got 0"),
        ({"workers": 2.5}, "workers must be a positive int, got 2.5"),
        ({"max_tokens": -1}, "max_tokens must be a positive int, got -1"),
    ],
)
def test_encode_names_bad_arguments(encoder, kwargs, match):
    with pytest.raises(ValueError, match=match):
        encoder.encode(["a"], **kwargs)


def test_workers_refused_while_a_trace_records(encoder):
    from clearformer.tracing import recording

    class Steps:
        def __init__(self):
            self.names = []

        def on_step(self, name, value, meta, file, line):
            self.names.append(name)

    steps = Steps()
    with recording(steps), pytest.raises(ValueError, match="workers must be 1 while a trace"):
        encoder.encode(["a", "b"], workers=2)
    assert steps.names == []  # refused before any forward pass


def test_encode_runs_two_workers_by_default_on_a_cpu_with_two_threads(encoder, monkeypatch):
    import clearformer.text.encoder as text_encoder

    from .helpers import intra_op_threads

    used = []
    real = text_encoder.map_in_workers

    def spy(fn, items, workers):
        used.append(workers)
        return real(fn, items, workers)

    monkeypatch.setattr(text_encoder, "map_in_workers", spy)
    with intra_op_threads(2):
        default = encoder.encode(TEXTS, batch_size=2)
        one = encoder.encode(TEXTS, batch_size=2, workers=1)
        encoder.encode(TEXTS[:2], batch_size=2)  # one batch: nothing to run side by side
    assert used == [2, 1, 1]
    np.testing.assert_allclose(default, one, atol=1e-6, rtol=0)


@pytest.mark.parametrize("onednn", [True, False])
def test_the_token_budget_follows_the_int8_route_unless_given(encoder, monkeypatch, onednn):
    """int8 calls whose products run through torch._int_mm take the smaller budget they were
    measured faster at; through oneDNN's op, float32's; a budget the caller gives is kept."""
    from clearformer.quant import onednn as onednn_module
    from clearformer.text import encoder as encoder_module
    from clearformer.text.batching import DEFAULT_MAX_TOKENS, INT_MM_MAX_TOKENS

    budgets = []

    def planned(lengths, batch_size, max_tokens):
        budgets.append(max_tokens)
        return plan_batches(lengths, batch_size, max_tokens)

    monkeypatch.setattr(encoder_module, "plan_batches", planned)
    monkeypatch.setattr(onednn_module, "onednn_int8_available", lambda: onednn)
    monkeypatch.setattr(encoder, "int8_model", lambda fused=False: encoder.model)  # no build
    # int8 runs as int8 here whatever this machine's CPU (elsewhere it would run as float32).
    import clearformer.quant
    from clearformer.quant import Int8Support

    monkeypatch.setattr(clearformer.quant, "int8_support", lambda: Int8Support(True, "mocked"))
    monkeypatch.setattr(encoder._models._precisions, "_decisions", {})
    encoder.encode(["a b"])
    encoder.encode(["a b"], precision="int8")
    encoder.encode(["a b"], precision="int8", max_tokens=300)
    encoder.encode(["a b"], max_tokens=None)
    int8_budget = DEFAULT_MAX_TOKENS if onednn else INT_MM_MAX_TOKENS
    assert budgets == [DEFAULT_MAX_TOKENS, int8_budget, 300, DEFAULT_MAX_TOKENS]
    assert INT_MM_MAX_TOKENS < DEFAULT_MAX_TOKENS
