"""Sharded ``.bin`` checkpoints (``pytorch_model.bin.index.json``) load with transformers'
outputs, each shard through ``torch.load(weights_only=True)``; an index and shards that
disagree get one clear error each. Writing safetensors is atomic."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
import torch

from clearformer import TextEncoder
from clearformer.interop.hf import CheckpointError
from clearformer.interop.hf.files import find_checkpoint
from clearformer.interop.hf.weights import read_tensors

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

INDEX = "pytorch_model.bin.index.json"
SHARDS = 3
_WORD_TEXT = "the a cat dog sat on mat and ran far away quick brown fox"
WORDS = _WORD_TEXT.split()
TEXTS = ["the cat sat on the mat", "", "quick brown fox ran far far away " * 3, "dog"]


def write_sharded_bin(state: dict[str, torch.Tensor], directory: Path, shards: int) -> dict:
    """``state`` as transformers 4 writes a sharded ``.bin`` checkpoint: consecutive groups of
    tensors in ``pytorch_model-0000i-of-0000n.bin`` and an index whose weight_map names them.

    (transformers 5 writes only safetensors, even with ``safe_serialization=False``, but still
    reads this layout.)"""
    names = list(state)
    size = -(-len(names) // shards)
    weight_map = {}
    for i in range(shards):
        file = f"pytorch_model-{i + 1:05d}-of-{shards:05d}.bin"
        group = {n: state[n].contiguous().clone() for n in names[i * size : (i + 1) * size]}
        torch.save(group, directory / file)
        weight_map.update(dict.fromkeys(group, file))
    total = sum(t.numel() * t.element_size() for t in state.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    _write_index(directory, index)
    return index


def _write_index(directory: Path, index: dict) -> None:
    (directory / INDEX).write_text(json.dumps(index, indent=2), encoding="utf-8")


def _shard(directory: Path, index: dict, number: int) -> Path:
    return directory / sorted(set(index["weight_map"].values()))[number]


@pytest.fixture
def checkpoint(tmp_path) -> tuple[Path, torch.nn.Module, dict]:
    """A small random BERT saved by transformers, its weights re-written as 3 ``.bin`` shards."""
    torch.manual_seed(0)
    cfg = transformers.BertConfig(
        vocab_size=40,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    model = transformers.BertModel(cfg)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # off the initial values, so LayerNorm ones/zeros cannot hide a swap
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=gen))
    model.eval().save_pretrained(str(tmp_path))
    for file in tmp_path.glob("model*.safetensors*"):
        file.unlink()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    (tmp_path / "vocab.txt").write_text("\n".join(specials + WORDS) + "\n", encoding="utf-8")
    index = write_sharded_bin(model.state_dict(), tmp_path, SHARDS)
    return tmp_path, model, index


def _hidden_states_match(encoder: TextEncoder, reference: torch.nn.Module) -> None:
    batch = encoder.tokenize(TEXTS)
    mask = batch.attention_mask
    assert not bool(mask.all())  # something is padded
    with torch.no_grad():
        ours = encoder.model(batch.input_ids, mask, batch.token_type_ids)
        ref = reference(
            input_ids=batch.input_ids,
            attention_mask=mask.long(),
            token_type_ids=batch.token_type_ids,
        ).last_hidden_state
    torch.testing.assert_close(ours[mask], ref[mask], atol=1e-5, rtol=1e-5)


def test_sharded_bin_matches_transformers(checkpoint):
    directory, original, index = checkpoint
    assert len(set(index["weight_map"].values())) == SHARDS
    assert find_checkpoint(directory).weights.name == INDEX
    encoder = TextEncoder.from_pretrained(directory)
    assert encoder.report.complete
    _hidden_states_match(encoder, original)
    # transformers reads the same shards (so they are laid out as it writes them)
    reloaded = transformers.AutoModel.from_pretrained(str(directory)).eval()
    _hidden_states_match(encoder, reloaded)


def test_every_shard_is_read(checkpoint):
    directory, reference, _ = checkpoint
    tensors = read_tensors(directory / INDEX)
    expected = reference.state_dict()
    assert set(tensors) == set(expected)
    for name, value in expected.items():
        assert torch.equal(tensors[name], value), name


def test_safetensors_stay_preferred(checkpoint):
    directory, reference, _ = checkpoint
    reference.save_pretrained(str(directory))
    safetensors = [p.name for p in directory.glob("model*.safetensors*")]
    assert safetensors  # model.safetensors, or transformers' own shards and index
    assert find_checkpoint(directory).weights.name in safetensors


# --- errors ------------------------------------------------------------------------------


def test_a_shard_lacking_an_assigned_tensor(checkpoint):
    directory, _, index = checkpoint
    shard = _shard(directory, index, 1)
    tensors = torch.load(shard, weights_only=True)
    dropped = sorted(tensors)[0]
    del tensors[dropped]
    torch.save(tensors, shard)
    with pytest.raises(CheckpointError, match=rf"shard {shard} lacks tensor '{dropped}'"):
        TextEncoder.from_pretrained(directory)


def test_a_tensor_in_two_shards(checkpoint):
    directory, _, index = checkpoint
    first, second = _shard(directory, index, 0), _shard(directory, index, 2)
    stolen = sorted(torch.load(first, weights_only=True))[0]
    extra = torch.load(second, weights_only=True)
    extra[stolen] = torch.zeros(1)
    torch.save(extra, second)
    with pytest.raises(
        CheckpointError,
        match=rf"tensor '{stolen}' is in two shards .*{first.name} and {second.name}",
    ):
        TextEncoder.from_pretrained(directory)


def test_a_tensor_the_index_does_not_list_is_kept_with_a_warning(checkpoint, caplog):
    directory, _, index = checkpoint
    shard = _shard(directory, index, 0)
    tensors = torch.load(shard, weights_only=True)
    tensors["pooler.extra.weight"] = torch.ones(2)
    torch.save(tensors, shard)
    with caplog.at_level(logging.WARNING, logger="clearformer.interop.hf.weights"):
        read = read_tensors(directory / INDEX)
    assert torch.equal(read["pooler.extra.weight"], torch.ones(2))
    assert "does not list" in caplog.text and shard.name in caplog.text


@pytest.mark.parametrize("suffix", [".pt", ".h5", ".msgpack"])
def test_other_shard_formats_are_refused(checkpoint, suffix):
    directory, _, index = checkpoint
    shard = _shard(directory, index, 1)
    renamed = shard.with_suffix(suffix)
    shard.rename(renamed)
    index["weight_map"] = {
        k: renamed.name if v == shard.name else v for k, v in index["weight_map"].items()
    }
    _write_index(directory, index)
    with pytest.raises(
        CheckpointError, match=rf"shard '{renamed.name}' with suffix '\{suffix}'; expected \.bin"
    ):
        TextEncoder.from_pretrained(directory)


def test_a_safetensors_index_never_reads_bin_shards(checkpoint):
    # Preferring safetensors must never end in torch.load: a .safetensors index that names a
    # .bin shard is refused before any shard is read.
    directory, _, index = checkpoint
    (directory / INDEX).rename(directory / "model.safetensors.index.json")
    with pytest.raises(CheckpointError, match=r"with suffix '\.bin'; expected \.safetensors"):
        TextEncoder.from_pretrained(directory)


def test_a_missing_shard(checkpoint):
    directory, _, index = checkpoint
    shard = _shard(directory, index, 2)
    shard.unlink()
    with pytest.raises(CheckpointError, match=rf"names a missing shard: {shard}"):
        TextEncoder.from_pretrained(directory)


@pytest.mark.parametrize("target", ["../outside.bin", "/tmp/absolute.bin", "sub/dir.bin", 3])
def test_shards_must_lie_beside_the_index(checkpoint, target):
    directory, _, index = checkpoint
    name = next(iter(index["weight_map"]))
    index["weight_map"][name] = target
    _write_index(directory, index)
    with pytest.raises(CheckpointError, match=rf"maps '{name}' to .*; expected the file name"):
        TextEncoder.from_pretrained(directory)


def test_a_shard_with_an_arbitrary_pickle_is_refused(checkpoint):
    directory, _, index = checkpoint
    shard = _shard(directory, index, 1)
    torch.save({"weights": Path("not a tensor")}, shard)
    with pytest.raises(CheckpointError, match=rf"cannot read {shard} with .*weights_only=True"):
        TextEncoder.from_pretrained(directory)


def test_an_index_without_weight_map(checkpoint):
    directory, _, _ = checkpoint
    _write_index(directory, {"metadata": {}})
    with pytest.raises(CheckpointError, match=rf"weights index .*{INDEX} has no 'weight_map'"):
        TextEncoder.from_pretrained(directory)


def test_write_safetensors_replaces_a_file_whole_or_not_at_all(tmp_path, monkeypatch):
    from safetensors.torch import load_file

    from clearformer.interop.hf.weights import write_safetensors

    path = tmp_path / "model.safetensors"
    write_safetensors({"a": torch.arange(6.0).view(2, 3).t()}, path)  # non-contiguous is fine
    assert torch.equal(load_file(str(path))["a"], torch.arange(6.0).view(2, 3).t())
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # as any new file, not mkstemp's 0600
    before = path.read_bytes()

    def fail(fd):  # the disk fails after the bytes went out, before the file is in place
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(OSError, match="disk full"):
        write_safetensors({"b": torch.zeros(3)}, path)
    assert path.read_bytes() == before  # the earlier file is left as it was
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]  # no temporary
