"""The ``threads`` varlen method: the same calls as ``sequence``, grouped per thread, giving the
same values forward and backward, in every grad mode, leaving the caller's thread count alone."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from clearformer.fast.varlen_threads import balanced_groups
from clearformer.packed_attention import varlen_attention
from clearformer.padding import pack_layout

from .helpers import intra_op_threads, lengths_mask


def _packed(lengths, heads=3, width=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    layout = pack_layout(lengths_mask(lengths))
    q, k, v = (torch.randn(layout.num_tokens, heads, width, generator=g) for _ in range(3))
    return q, k, v, layout


@settings(max_examples=30, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 20), min_size=1, max_size=12),
    groups=st.integers(1, 4),
)
def test_groups_are_contiguous_non_empty_and_cover_every_run(lengths, groups):
    runs = pack_layout(lengths_mask(lengths)).runs
    if not runs:
        return
    cut = balanced_groups(runs, groups)
    assert [i for g in cut for i in g] == list(range(len(runs)))
    assert all(cut) and len(cut) <= groups


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("causal", [False, True])
def test_equal_to_sequence_forward_and_backward(threads, causal):
    lengths = [7, 0, 3, 3, 12, 1, 9, 9, 9, 4]
    q, k, v, layout = _packed(lengths)
    grads = {}
    outs = {}
    with intra_op_threads(threads):
        for method in ("sequence", "threads"):
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            out = varlen_attention(*leaves, layout, method=method, is_causal=causal)
            out.pow(2).sum().backward()
            outs[method], grads[method] = out.detach(), [t.grad for t in leaves]
        assert torch.get_num_threads() == threads  # the caller's count is untouched
    # One thread or several can split a kernel's sums differently: equal within rounding.
    torch.testing.assert_close(outs["threads"], outs["sequence"], atol=1e-6, rtol=0)
    for a, b in zip(grads["threads"], grads["sequence"], strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_grad_and_inference_modes_reach_the_workers():
    q, k, v, layout = _packed([5, 6, 7, 8])
    with intra_op_threads(2):
        with torch.inference_mode():
            out = varlen_attention(q, k, v, layout, method="threads")
        assert out.is_inference()
        with torch.no_grad():
            leaf = q.clone().requires_grad_()
            assert not varlen_attention(leaf, k, v, layout, method="threads").requires_grad
        leaf = q.clone().requires_grad_()
        assert varlen_attention(leaf, k, v, layout, method="threads").requires_grad


def test_the_stack_takes_threads_on_cpu_and_equals_math():
    from clearformer import Encoder, EncoderConfig

    torch.manual_seed(0)
    encoder = Encoder(EncoderConfig(d_model=24, n_heads=3, n_layers=2, dim_mlp=48)).eval()
    mask = lengths_mask([9, 2, 14, 5, 5, 11])
    x = torch.randn(6, mask.shape[1], 24)
    with intra_op_threads(2):
        plan = encoder.plan_for(mask)
        assert plan.method.choice == "threads"
        with torch.no_grad():
            got = encoder(x, mask)
            want = encoder(x, mask, backend="math")
    torch.testing.assert_close(got, want, atol=2e-6, rtol=0)


def test_a_forked_child_attends_with_pools_of_its_own():
    import multiprocessing

    q, k, v, layout = _packed([5, 6, 7, 8])
    with intra_op_threads(2):
        want = varlen_attention(q, k, v, layout, method="threads")  # the parent's pool exists
        context = multiprocessing.get_context("fork")
        with context.Pool(1) as pool:
            got = pool.apply_async(_attend_in_child, (q, k, v, layout)).get(timeout=60)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def _attend_in_child(q, k, v, layout):
    torch.set_num_threads(2)
    return varlen_attention(q, k, v, layout, method="threads")


def test_new_worker_threads_leave_the_count_later_threads_start_with():
    # A worker sets its own count to 1, which also becomes what every later new thread of the
    # process starts with; the caller restores it, as encode's batch workers do.
    import threading

    from clearformer.fast import varlen_threads

    q, k, v, layout = _packed([5, 9, 3, 7])
    with varlen_threads._LOCK:
        old = list(varlen_threads._POOLS.values())
        varlen_threads._POOLS.clear()  # the next call starts new worker threads
    for pool in old:
        pool.shutdown(wait=True)
    with intra_op_threads(2):
        varlen_attention(q, k, v, layout, method="threads")
        seen = []
        thread = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
        thread.start()
        thread.join()
    assert seen == [2]
