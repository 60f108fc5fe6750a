"""A load in int8 reads one encoder layer at a time (``load_model(defer_layers=True)``,
:func:`clearformer.quant.streamed.quantize_int8_by_block`): each layer's float32 weights are
gone before the next layer is read, the result is the int8 model built from the whole float32
one, bit for bit, and the loads that cannot go layer by layer (missing weights, the reference
stack) read the whole model instead. The family-by-family check of the same is
tests/test_family_precision.py's ``test_loaded_in_int8_reads_one_layer_at_a_time``."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from clearformer import TextEncoder
from clearformer.interop.hf import CheckpointError
from clearformer.interop.hf.deferred import DeferredLayers
from clearformer.interop.hf.loading import load_model
from clearformer.quant.int8 import int8_support

from .helpers import write_tiny_bert

needs_int8 = pytest.mark.skipif(
    not int8_support().available, reason=f"no int8 here: {int8_support().reason}"
)
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "a", "mat"]
TEXTS = ["the cat sat", "a cat on the mat sat on a mat the cat", "mat", "on a mat", "the"]


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return write_tiny_bert(tmp_path_factory.mktemp("bert"), WORDS, n_layers=4, width=32, heads=4)


def _per_call(path, **load) -> np.ndarray:
    """int8 built from the whole float32 model: encode(precision="int8") of a float32 load."""
    return TextEncoder.from_pretrained(path, **load).encode(TEXTS, precision="int8")


@needs_int8
def test_each_layer_is_let_go_before_the_next_is_read(bert, monkeypatch):
    """The float32 linear layers of layer i are unreachable when layer i + 1 is read: nothing
    (a calibration hook, a module table) keeps them once their int8 layers replace them."""
    read = DeferredLayers.read
    kept: list[list[weakref.ref]] = []
    alive_at_read: list[int] = []

    def spy(self, index):
        gc.collect()
        alive_at_read.append(sum(ref() is not None for refs in kept for ref in refs))
        read(self, index)
        layer = self.model.encoder.layers[index]
        kept.append([weakref.ref(m) for m in layer.modules() if isinstance(m, torch.nn.Linear)])

    monkeypatch.setattr(DeferredLayers, "read", spy)
    held = TextEncoder.from_pretrained(bert, precision="int8")
    gc.collect()
    assert all(kept), "every layer has linear layers to convert"
    assert alive_at_read == [0, 0, 0, 0]
    assert sum(ref() is not None for refs in kept for ref in refs) == 0
    assert np.array_equal(held.encode(TEXTS), _per_call(bert))


@needs_int8
def test_the_reference_stack_reads_the_whole_model_and_gives_the_same_model(bert, monkeypatch):
    """backend="math" runs the reference stack, which calls no block's hooks: the held load
    reads every layer first and converts the whole model, as before."""
    import clearformer.quant.streamed as streamed

    monkeypatch.setattr(streamed, "quantize_int8_by_block", None)  # must not be reached
    held = TextEncoder.from_pretrained(bert, precision="int8", backend="math")
    assert not any(p.is_meta for p in held.model.parameters())
    assert np.array_equal(held.encode(TEXTS), _per_call(bert, backend="math"))


def test_a_checkpoint_lacking_a_weight_is_read_whole(bert, tmp_path):
    """strict=False keeps a missing weight at its initial value, which only a float32 model
    built whole has: such a load defers nothing."""
    partial = tmp_path / "partial"
    partial.mkdir()
    for name in ("config.json", "vocab.txt"):
        (partial / name).write_bytes((bert / name).read_bytes())
    tensors = load_file(bert / "model.safetensors")
    dropped = next(k for k in tensors if ".layer.1." in k and k.endswith("dense.weight"))
    del tensors[dropped]
    save_file(tensors, partial / "model.safetensors")
    with pytest.raises(CheckpointError, match="missing"):
        load_model(partial, defer_layers=True)
    loaded = load_model(partial, strict=False, defer_layers=True)
    assert loaded.deferred is None
    assert not any(p.is_meta for p in loaded.model.parameters())
    assert np.isfinite(
        TextEncoder.from_pretrained(partial, strict=False, precision="int8").encode(TEXTS)
    ).all()


def test_defer_layers_reads_float32_alone(bert):
    with pytest.raises(ValueError, match="defer_layers reads float32 layers, got precision='bf16'"):
        load_model(bert, precision="bf16", defer_layers=True)


def test_a_deferred_model_read_whole_equals_a_whole_load(bert):
    whole = load_model(bert).model.state_dict()
    deferred = load_model(bert, defer_layers=True)
    assert sum(p.is_meta for p in deferred.model.parameters()) > 0
    deferred.deferred.read_all()
    read = deferred.model.state_dict()
    assert set(read) == set(whole)
    assert all(torch.equal(read[k], whole[k]) for k in whole)


@needs_int8
def test_mpnet_relative_bias_outside_the_layers(tmp_path):
    """MPNet's relative position bias lives outside the layers (read with the embeddings, run
    before the first block): the conversion a block at a time equals the whole one, every
    int8 tensor and every output to the bit."""
    from clearformer.quant import quantize_int8_calibrated
    from clearformer.quant.streamed import quantize_int8_by_block

    from .test_mpnet import _batch, make_mpnet

    make_mpnet(tmp_path)
    ids, mask = _batch()

    def run(model):
        with torch.inference_mode():
            return model(ids, mask)

    whole = quantize_int8_calibrated(load_model(tmp_path).model, run, in_place=True)
    loaded = load_model(tmp_path, defer_layers=True)
    blocks = [(f"encoder.layers.{i}", b) for i, b in enumerate(loaded.model.encoder.layers)]
    by_block = quantize_int8_by_block(loaded.model, run, blocks, loaded.deferred.read)
    a, b = whole.state_dict(), by_block.state_dict()
    assert set(a) == set(b) and any(t.dtype == torch.int8 for t in a.values())
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert torch.equal(run(whole), run(by_block))
