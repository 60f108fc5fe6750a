"""Weights reordered once per call (clearformer.fast.reordered_weights): the fused layers give
the same numbers from a reordered copy as from the layer's own weight, notice a weight changed after
packing, never reach past their scope or thread, and ``encode`` uses them."""

from __future__ import annotations

import dataclasses
import sys
import threading

import numpy as np
import pytest
import torch
from torch import nn

import clearformer.fast.reordered_weights as reordered_weights_module
from clearformer.fast.fused_linear import linear
from clearformer.fast.reordered_weights import (
    ReorderedWeights,
    reordered_weight,
    use_reordered_weights,
)
from clearformer.machine import machine
from clearformer.text import TextEncoder

from .helpers import record_packings

pytestmark = pytest.mark.skipif(
    not machine().onednn, reason="this PyTorch build has no oneDNN fused linear op"
)


def _layer(k: int = 48, n: int = 80) -> nn.Linear:
    torch.manual_seed(3)
    return nn.Linear(k, n)


@pytest.mark.parametrize("rows", [1, 7, 64, 300])
@pytest.mark.parametrize("kind", ["plain", "gelu", "residual"])
def test_packed_copy_gives_the_same_numbers(rows, kind):
    layer = _layer()
    x = torch.randn(rows, 48)
    residual = torch.randn(rows, 80)
    kwargs = {"gelu": {"activation": "gelu"}, "residual": {"residual": residual}}.get(kind, {})
    packed = ReorderedWeights()
    with torch.inference_mode():
        want = linear(x, layer, **kwargs)
        with use_reordered_weights(packed):
            first = linear(x, layer, **kwargs)  # packs
            again = linear(x, layer, **kwargs)  # reuses
    assert len(packed) == 1
    assert torch.equal(first, again)
    if rows == 1:  # a single row may take oneDNN's matrix-vector kernel: another sum order
        torch.testing.assert_close(first, want, atol=1e-5, rtol=1e-5)
    else:
        assert torch.equal(first, want)


def test_a_weight_changed_after_packing_is_packed_again():
    layer = _layer()
    x = torch.randn(5, 48)
    packed = ReorderedWeights()
    with torch.inference_mode(), use_reordered_weights(packed):
        before = linear(x, layer)
        with torch.no_grad():
            layer.weight.mul_(-2.0)  # in place: the version counter moves
        after_update = linear(x, layer)
        with torch.inference_mode(False):
            layer.weight = nn.Parameter(torch.randn(80, 48))  # a new tensor
        after_swap = linear(x, layer)
        want_swap = x @ layer.weight.T + layer.bias
        with torch.inference_mode(False):
            layer.weight.data = torch.randn(80, 48)  # new storage, same tensor and version
        after_data = linear(x, layer)
        want_data = x @ layer.weight.T + layer.bias
    assert not torch.allclose(before, after_update)
    torch.testing.assert_close(after_update - layer.bias, -2.0 * (before - layer.bias))
    torch.testing.assert_close(after_swap, want_swap, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(after_data, want_data, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(after_swap, after_data)


def test_outside_its_block_and_on_other_threads_the_layers_own_weight_is_read():
    layer = _layer()
    packed = ReorderedWeights()
    seen = {}

    def other_thread():
        seen["other"] = reordered_weight(layer)

    with use_reordered_weights(packed):
        inside = reordered_weight(layer)
        worker = threading.Thread(target=other_thread)
        worker.start()
        worker.join()
    assert inside is not layer.weight and inside.is_mkldnn
    if not getattr(sys.flags, "thread_inherit_context", False):
        assert seen["other"] is layer.weight  # a new thread starts outside every block
    assert reordered_weight(layer) is layer.weight


def test_where_weights_cannot_be_reordered_the_layers_own_are_read(monkeypatch):
    import clearformer.fast.reordered_weights as reordered_weights

    layer = _layer()
    without = dataclasses.replace(machine(), reorder=frozenset())
    monkeypatch.setattr(reordered_weights, "machine", lambda: without)
    packed = ReorderedWeights()
    with use_reordered_weights(packed):
        assert reordered_weight(layer) is layer.weight
    assert len(packed) == 0


def test_weights_it_cannot_watch_or_oneDNN_does_not_take_are_left_alone():
    half = _layer().to(torch.float16)
    with torch.inference_mode():
        made_in_inference_mode = nn.Linear(48, 80)  # no version counter to watch
    with use_reordered_weights(ReorderedWeights()):
        assert reordered_weight(half) is half.weight
        assert reordered_weight(made_in_inference_mode) is made_in_inference_mode.weight


def test_bfloat16_weights_are_packed_and_give_the_plain_products():
    if torch.bfloat16 not in machine().reorder:
        pytest.skip("oneDNN does not reorder bfloat16 weights here")
    layer = _layer().to(torch.bfloat16)
    x = torch.randn(7, 48, dtype=torch.bfloat16)
    packed = ReorderedWeights()
    with torch.no_grad():
        plain = linear(x, layer, residual=torch.ones(7, 80, dtype=torch.bfloat16))
        with use_reordered_weights(packed):
            assert reordered_weight(layer) is not layer.weight and len(packed) == 1
            got = linear(x, layer, residual=torch.ones(7, 80, dtype=torch.bfloat16))
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, plain, atol=0, rtol=0)


@pytest.fixture(scope="module")
def encoder() -> TextEncoder:
    return TextEncoder.from_pretrained()


@pytest.mark.parametrize("workers", [1, 2])
def test_encode_reads_reordered_weights_and_gives_the_same_vectors(encoder, monkeypatch, workers):
    texts = [f"sentence number {i} " + "word " * (i % 40) for i in range(90)]
    tokens = sum(len(e.ids) for e in encoder.tokenizer.encode(texts))
    assert tokens >= reordered_weights_module.REORDER_MIN_TOKENS  # a call large enough to pack
    encoder.drop_reordered_weights()  # as a new encoder
    made = record_packings(monkeypatch, reordered_weights_module)
    packed = encoder.encode(texts, workers=workers, batch_size=16, progress=False)
    linears = sum(type(m) is nn.Linear for m in encoder.model.modules())
    assert len(made) == 1 and len(made[0]) == linears > 0
    again = encoder.encode(texts[:3], workers=workers, progress=False)  # a later, short call
    assert len(made) == 1  # kept: the short call reads the same copies
    encoder.drop_reordered_weights()
    monkeypatch.setattr(reordered_weights_module, "REORDER_MIN_TOKENS", 10**12)  # never packs
    plain = encoder.encode(texts, workers=workers, batch_size=16, progress=False)
    assert len(made) == 1
    assert np.array_equal(packed, plain)
    np.testing.assert_allclose(again, plain[:3], rtol=0, atol=1e-6)


def test_encode_packs_once_its_calls_have_carried_enough_tokens(encoder, monkeypatch):
    # Reordering every weight would cost more than one call of a few texts saves by it; a
    # stream of such calls repays it.
    texts = ["A short query.", "Another one, a little longer than the first."]
    tokens = sum(len(e.ids) for e in encoder.tokenizer.encode(texts))
    encoder.drop_reordered_weights()
    made = record_packings(monkeypatch, reordered_weights_module)
    monkeypatch.setattr(reordered_weights_module, "REORDER_MIN_TOKENS", 2 * tokens + 1)
    short = encoder.encode(texts, progress=False)
    encoder.encode(texts, progress=False)
    assert made == []  # 2 * tokens so far: below the threshold
    packed = encoder.encode(texts, progress=False)
    assert len(made) == 1 and len(made[0]) > 0
    np.testing.assert_allclose(short, packed, rtol=0, atol=1e-6)


def test_kept_packing_counts_calls_and_drops():
    kept = reordered_weights_module.KeptReordering()
    threshold = reordered_weights_module.REORDER_MIN_TOKENS
    assert kept.for_call(threshold - 1) is None and kept.kept is None
    first = kept.for_call(1)
    assert isinstance(first, ReorderedWeights) and kept.for_call(1) is first is kept.kept
    kept.drop()
    assert kept.kept is None and kept.for_call(threshold - 1) is None  # counting from zero


def test_a_model_past_the_memory_limit_keeps_no_copy(encoder, monkeypatch):
    """A second copy of a large model's weights costs more memory than its few per cent save:
    past REORDER_MAX_BYTES nothing is kept, however many tokens the calls carry, and the results
    are those of plain weights."""
    weights = reordered_weights_module.linear_weight_bytes(encoder.model)
    linears = [m for m in encoder.model.modules() if isinstance(m, nn.Linear)]
    assert weights == sum(4 * m.weight.numel() for m in linears) > 0  # float32
    texts = [f"sentence number {i} " + "word " * (i % 40) for i in range(90)]
    made = record_packings(monkeypatch, reordered_weights_module)
    monkeypatch.setattr(reordered_weights_module, "REORDER_MAX_BYTES", weights - 1)
    large = type(encoder).from_pretrained(encoder.path)  # a new encoder reads the limit
    assert large._reordering.too_large
    plain = large.encode(texts, batch_size=16, progress=False)
    large.keep_weights_reordered()  # asked outright: still no copy
    assert large.encode(texts[:3], progress=False).shape[0] == 3
    assert made == [] and large._reordering.kept is None
    monkeypatch.setattr(
        reordered_weights_module, "REORDER_MAX_BYTES", weights
    )  # at the limit: kept
    small = type(encoder).from_pretrained(encoder.path)
    assert not small._reordering.too_large
    packed = small.encode(texts, batch_size=16, progress=False)
    assert len(made) == 1 and small._reordering.kept is not None
    assert np.array_equal(packed, plain)


@pytest.mark.parametrize("num_beams", [1, 3])
def test_generate_reads_reordered_weights_and_decodes_the_same(monkeypatch, num_beams):
    import clearformer.generation as generation
    from clearformer import Seq2SeqConfig, Seq2SeqTransformer

    torch.manual_seed(0)
    config = Seq2SeqConfig(
        src_vocab_size=50, d_model=32, n_heads=4, encoder_layers=2, decoder_layers=2,
        dim_mlp=64, dropout=0.0, max_positions=40,
    )  # fmt: skip
    model = Seq2SeqTransformer(config).eval()
    src = torch.randint(4, 50, (3, 9))
    made = record_packings(monkeypatch, generation)
    packed = model.generate(src, max_new_tokens=12, min_length=12, num_beams=num_beams)
    monkeypatch.setattr(generation, "ReorderedWeights", lambda: None)
    plain = model.generate(src, max_new_tokens=12, min_length=12, num_beams=num_beams)
    assert len(made) == 1 and len(made[0]) > 0
    assert torch.equal(packed.sequences, plain.sequences)
    torch.testing.assert_close(packed.scores, plain.scores)
