"""``load_model`` reads safetensors one tensor at a time: the lazy reader returns what
safetensors returns, bit for bit, for every dtype; it refuses the damaged files safetensors
refuses, naming the file, before any tensor is read; the model it fills is the one the eager
reader fills; and the load's peak memory stays near the model's own size, where the eager
reader (the negative control) holds the checkpoint whole besides.

Every checkpoint is built from random weights by transformers; no download.
"""

from __future__ import annotations

import json
import logging
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import clearformer
from clearformer.interop.hf import CheckpointError, load_model, weights
from clearformer.interop.hf.files import find_checkpoint
from clearformer.interop.hf.loading import build_model, read_family
from clearformer.interop.hf.safetensors_file import StoredTensor, read_header
from clearformer.interop.hf.weights import CheckpointTensors, open_tensors, read_tensors
from clearformer.precision import bf16_copy

from .family_helpers import perturb, word_tokenizer
from .test_family_gte_nomic import SIZES
from .test_family_qwen3 import qwen3_config

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

# Every dtype of the format that torch has (the float8 and unsigned ones where this torch has
# them), as the format spells them.
DTYPES = {
    code: dtype
    for code, dtype in {
        "BOOL": torch.bool,
        "U8": torch.uint8,
        "I8": torch.int8,
        "I16": torch.int16,
        "I32": torch.int32,
        "I64": torch.int64,
        "F16": torch.float16,
        "BF16": torch.bfloat16,
        "F32": torch.float32,
        "F64": torch.float64,
        "C64": torch.complex64,
        "U16": getattr(torch, "uint16", None),
        "U32": getattr(torch, "uint32", None),
        "U64": getattr(torch, "uint64", None),
        "F8_E4M3": getattr(torch, "float8_e4m3fn", None),
        "F8_E5M2": getattr(torch, "float8_e5m2", None),
    }.items()
    if dtype is not None
}
SHAPES = [(3, 5), (), (0, 4), (2, 1, 3)]  # a matrix, a scalar, an empty one, 3-d


def _random(dtype: torch.dtype, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Random bits of ``dtype`` (NaNs and all: the comparison is bitwise); booleans 0 or 1."""
    count = 1
    for size in shape:
        count *= size
    if dtype is torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    raw = torch.randint(0, 256, (count * dtype.itemsize,), dtype=torch.uint8, generator=gen)
    return raw.view(dtype).reshape(shape)


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().reshape(-1).view(torch.uint8)


def _same_bits(ours: torch.Tensor, theirs: torch.Tensor) -> bool:
    return (
        ours.dtype == theirs.dtype
        and ours.shape == theirs.shape
        and torch.equal(_bits(ours), _bits(theirs))
    )


@pytest.fixture(scope="module")
def every_dtype(tmp_path_factory) -> Path:
    gen = torch.Generator().manual_seed(0)
    tensors = {
        f"{code}.{'x'.join(map(str, shape)) or 'scalar'}": _random(dtype, shape, gen)
        for code, dtype in DTYPES.items()
        for shape in SHAPES
    }
    path = tmp_path_factory.mktemp("dtypes") / "model.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    return path


def test_every_dtype_reads_as_safetensors_reads_it(every_dtype):
    reference = load_file(str(every_dtype))
    lazy = open_tensors(every_dtype)
    assert sorted(lazy) == sorted(reference) and len(reference) == len(DTYPES) * len(SHAPES)
    for name, theirs in reference.items():
        assert lazy.shape(name) == tuple(theirs.shape), name
        assert _same_bits(lazy[name], theirs), name


def test_rows_are_read_alone_and_in_place(every_dtype):
    reference = load_file(str(every_dtype))
    stored = read_header(every_dtype)
    for code in DTYPES:
        name = f"{code}.3x5"
        assert _same_bits(stored[name].read((1, 3)), reference[name][1:3]), name
        assert _same_bits(stored[name].read((2, 2)), reference[name][2:2]), name
        into = torch.empty(5, 5, dtype=DTYPES[code])
        stored[name].read_into(into[2:4], (0, 2))  # a block of a larger tensor's rows
        assert _same_bits(into[2:4], reference[name][0:2]), name


def test_copy_into_converts_the_dtype_as_copy_does(every_dtype):
    lazy = open_tensors(every_dtype)
    reference = load_file(str(every_dtype))
    for code in ("F16", "BF16", "I64", "F32"):
        name = f"{code}.3x5"
        into = torch.zeros(4, 5, dtype=torch.float64)
        lazy.copy_into(name, into[1:3], (1, 3))
        expected = torch.zeros(4, 5, dtype=torch.float64)
        expected[1:3].copy_(reference[name][1:3])
        assert torch.equal(into.nan_to_num(7.0), expected.nan_to_num(7.0)), name


@pytest.mark.parametrize("block", [1, 25, 2**20], ids=["byte", "rows", "whole"])
def test_copy_into_converts_block_by_block_as_copy_does(every_dtype, monkeypatch, block):
    """A converting copy reads its rows in blocks of at most CONVERT_BLOCK_BYTES (at least a
    row): every block size gives what one ``copy_`` of the whole gives."""
    monkeypatch.setattr(weights, "CONVERT_BLOCK_BYTES", block)
    lazy = open_tensors(every_dtype)
    reference = load_file(str(every_dtype))
    for code in ("F16", "BF16", "F32", "F64"):
        cases = [(f"{code}.3x5", None), (f"{code}.3x5", (1, 3)), (f"{code}.2x1x3", None)]
        for name, rows in [*cases, (f"{code}.0x4", None), (f"{code}.scalar", None)]:
            source = reference[name] if rows is None else reference[name][rows[0] : rows[1]]
            into = torch.zeros(source.shape, dtype=torch.bfloat16)
            lazy.copy_into(name, into, rows)
            expected = torch.zeros(source.shape, dtype=torch.bfloat16).copy_(source)
            assert _same_bits(into, expected), (name, rows)


def test_a_dict_of_tensors_reads_the_same_way():
    tensors = {"a": torch.arange(12.0).view(4, 3), "b": torch.tensor(2)}
    wrapped = CheckpointTensors(tensors)
    assert wrapped.shape("a") == (4, 3) and wrapped.shape("b") == ()
    assert wrapped["a"] is tensors["a"]
    into = torch.empty(2, 3, dtype=torch.float16)
    wrapped.copy_into("a", into, (2, 4))
    assert torch.equal(into, tensors["a"][2:4].half())


def test_read_into_refuses_a_destination_that_does_not_fit(every_dtype):
    stored = read_header(every_dtype)["F32.3x5"]
    with pytest.raises(ValueError, match="needs 60 bytes"):
        stored.read_into(torch.empty(3, 4))
    with pytest.raises(ValueError, match="contiguous torch.float32"):
        stored.read_into(torch.empty(5, 3).t())
    with pytest.raises(ValueError, match="outside a tensor"):
        stored.read((2, 4))


# --- damaged files --------------------------------------------------------------------------


def _raw(header: object, data: bytes) -> bytes:
    """A safetensors file from a header written as given (possibly wrong) and raw data."""
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def _f32(offsets, shape=(1,), dtype="F32") -> dict:
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


DAMAGED = {
    "garbage": b"\x00\x01not a safetensors file",
    "shorter than its length field": b"\x01\x02\x03",
    "header length past the end": struct.pack("<Q", 4096) + b"{}",
    "header length over the limit": struct.pack("<Q", 2**40) + b"{}",
    "header not JSON": struct.pack("<Q", 6) + b"{nope}",
    "header not UTF-8": struct.pack("<Q", 2) + b"\xff\xfe",
    "header not an object": _raw([1, 2], b""),
    "entry not an object": _raw({"a": 3}, b""),
    "unknown dtype": _raw({"a": _f32((0, 4), dtype="X9")}, bytes(4)),
    "negative size": _raw({"a": _f32((0, 4), shape=(-1,))}, bytes(4)),
    "offsets not a pair": _raw({"a": _f32((4,))}, bytes(4)),
    "offsets reversed": _raw({"a": _f32((4, 0))}, bytes(4)),
    "offsets of another size": _raw({"a": _f32((0, 4), shape=(2,))}, bytes(4)),
    "offsets out of range": _raw({"a": _f32((0, 4)), "b": _f32((4, 8))}, bytes(4)),
    "a gap": _raw({"a": _f32((4, 8))}, bytes(8)),
    "an overlap": _raw({"a": _f32((0, 4)), "b": _f32((0, 4))}, bytes(4)),
    "bytes no tensor owns": _raw({"a": _f32((0, 4))}, bytes(8)),
}


@pytest.mark.parametrize("damage", sorted(DAMAGED))
def test_a_damaged_file_is_refused_naming_it(tmp_path, damage):
    path = tmp_path / "model.safetensors"
    path.write_bytes(DAMAGED[damage])
    with pytest.raises(Exception):  # noqa: B017 - safetensors refuses it too, in its own words
        load_file(str(path))
    wording = rf"^cannot read {re.escape(str(path))}: .+ \(the file is corrupt or truncated\)$"
    with pytest.raises(CheckpointError, match=wording):
        open_tensors(path)


def test_a_file_cut_short_is_refused_by_load_model(tmp_path):
    directory = _write_bert(tmp_path / "bert")
    weights = directory / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match=rf"cannot read {re.escape(str(weights))}: .*past"):
        load_model(directory)


def test_a_file_cut_short_after_its_header_was_read(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({"a": torch.arange(10.0)}, str(path))
    stored = read_header(path)["a"]
    path.write_bytes(path.read_bytes()[:-8])  # shortened between the header and the read
    with pytest.raises(CheckpointError, match=r"cannot read .* inside a tensor's data"):
        stored.read()


def test_metadata_and_an_empty_file_are_fine(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(_raw({"__metadata__": {"format": "pt"}}, b""))
    assert len(open_tensors(path)) == 0 == len(load_file(str(path)))


# --- loading through the lazy reader ------------------------------------------------------


def _write_bert(directory: Path, dtype: torch.dtype = torch.float32, **save) -> Path:
    """A random BertModel (its pooler is kept by a load) saved by transformers."""
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=48,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    model = transformers.BertModel(config)
    perturb(model, seed=3)
    model.to(dtype).save_pretrained(str(directory), **save)
    word_tokenizer(directory)
    return directory


def _write_qwen3(directory: Path) -> Path:
    """A random Qwen3Model: grouped-query q; k; v and gate; up fused into one parameter each."""
    torch.manual_seed(0)
    config = qwen3_config(num_hidden_layers=2)
    model = transformers.Qwen3Model(config)
    perturb(model, seed=5)
    model.save_pretrained(str(directory))
    word_tokenizer(directory)
    return directory


def _write_gte(directory: Path) -> Path:
    """A random GteModel: its up_gate_proj is one tensor read as two parts, in swapped order."""
    torch.manual_seed(0)
    config = transformers.GteConfig(**{**SIZES, "num_hidden_layers": 2}, type_vocab_size=1)
    model = transformers.GteModel(config)
    perturb(model, seed=7)
    model.save_pretrained(str(directory))
    word_tokenizer(directory, template="<bos> $A <eos>")
    return directory


WRITERS = {
    "bert": _write_bert,
    "bert-bf16": lambda d: _write_bert(d, torch.bfloat16),
    "bert-sharded": lambda d: _write_bert(d, max_shard_size="20KB"),
    "qwen3": _write_qwen3,
    "gte": _write_gte,
}


def _eager_load(directory: Path):
    """The model as the eager reader fills it: every tensor read first, into a dict."""
    files = find_checkpoint(directory)
    family, config = read_family(files, "auto")
    return build_model(files, family, config, read_tensors(files.weights), strict=True)


@pytest.mark.parametrize("kind", sorted(WRITERS))
def test_the_lazy_load_fills_the_model_the_eager_load_fills(tmp_path, kind):
    directory = WRITERS[kind](tmp_path / kind)
    if kind == "bert-sharded":
        assert find_checkpoint(directory).weights.name == "model.safetensors.index.json"
    lazy, eager = load_model(directory), _eager_load(directory)
    assert lazy.report.loaded == eager.report.loaded and lazy.report.complete
    assert lazy.report.unused == eager.report.unused
    ours, theirs = lazy.model.state_dict(), eager.model.state_dict()
    for name, value in theirs.items():
        assert _same_bits(ours[name], value), name
    assert sorted(lazy.kept) == sorted(eager.kept)
    for name, value in eager.kept.items():
        assert isinstance(lazy.kept[name], torch.Tensor) and _same_bits(lazy.kept[name], value)
    if kind.startswith("bert"):
        assert lazy.kept  # the pooler, read for real


@pytest.mark.parametrize("kind", sorted(WRITERS))
def test_a_load_in_bf16_is_the_bf16_copy_of_the_float32_load(tmp_path, kind):
    """``precision="bf16"`` builds the model empty in bfloat16 and fills it from the file: the
    same tensors, dtypes and ties as ``bf16_copy`` of the float32 model, bit for bit."""
    directory = WRITERS[kind](tmp_path / kind)
    direct = load_model(directory, precision="bf16")
    copied = bf16_copy(load_model(directory).model)
    ours, theirs = dict(direct.model.named_parameters()), dict(copied.named_parameters())
    assert sorted(ours) == sorted(theirs)
    for name, value in theirs.items():
        assert not ours[name].requires_grad and _same_bits(ours[name], value), name
    assert {v.dtype for v in ours.values()} >= {torch.bfloat16}
    for name, buffer in copied.named_buffers():
        assert _same_bits(dict(direct.model.named_buffers())[name], buffer), name


def test_a_model_built_empty_in_bf16_computes_its_buffers_for_real():
    """A sinusoidal position table is computed, not loaded: the model built on the meta
    device gets it on the CPU, equal to the float32 model's, and nothing is left on meta."""
    from clearformer import EncoderConfig, EncoderModel
    from clearformer.precision import empty_bf16

    config = EncoderConfig(d_model=16, n_heads=2, n_layers=1, dim_mlp=32, vocab_size=20,
                           positions="sinusoidal")  # fmt: skip
    with torch.device("meta"):
        empty = EncoderModel(config)
    built = empty_bf16(empty)
    table = built.embeddings.position_table
    assert not table.is_meta and torch.equal(table, EncoderModel(config).embeddings.position_table)
    assert not any(t.is_meta for t in (*built.parameters(), *built.buffers()))
    # Built inside the meta context: refused, not half-made.
    with torch.device("meta"), pytest.raises(ValueError, match="on the meta device"):
        empty_bf16(EncoderModel(config))


def test_a_load_in_bf16_needs_every_weight(tmp_path):
    directory = _write_bert(tmp_path / "bert")
    path = directory / "model.safetensors"
    tensors = load_file(str(path))
    tensors.pop("encoder.layer.1.output.dense.bias")
    save_file(tensors, str(path), metadata={"format": "pt"})
    assert not load_model(directory, strict=False).report.complete  # float32 starts it at random
    with pytest.raises(CheckpointError, match=r"lacks .*output\.dense\.bias.* loaded in bf16"):
        load_model(directory, strict=False, precision="bf16")


def test_shapes_are_checked_before_any_tensor_is_read(tmp_path, monkeypatch):
    directory = _write_bert(tmp_path / "bert")
    path = directory / "model.safetensors"
    tensors = load_file(str(path))
    tensors["encoder.layer.1.output.dense.weight"] = torch.zeros(32, 63)  # the last layer's
    save_file(tensors, str(path), metadata={"format": "pt"})
    reads = []
    original = StoredTensor.read_into
    monkeypatch.setattr(
        StoredTensor, "read_into", lambda self, *a: reads.append(self) or original(self, *a)
    )
    with pytest.raises(CheckpointError, match=r"output\.dense\.weight .* shape \(32, 63\)"):
        load_model(directory)
    assert reads == []


# --- a sharded safetensors checkpoint that does not hang together --------------------------


@pytest.fixture
def sharded(tmp_path) -> tuple[Path, list[Path]]:
    directory = _write_bert(tmp_path / "sharded", max_shard_size="20KB")
    shards = sorted(directory.glob("model-*.safetensors"))
    assert len(shards) >= 3
    return directory, shards


def _rewrite(shard: Path, edit) -> None:
    tensors = load_file(str(shard))
    edit(tensors)
    save_file(tensors, str(shard), metadata={"format": "pt"})


def test_a_safetensors_shard_lacking_an_assigned_tensor(sharded):
    directory, shards = sharded
    dropped = sorted(load_file(str(shards[1])))[0]
    _rewrite(shards[1], lambda t: t.pop(dropped))
    with pytest.raises(CheckpointError, match=rf"shard {shards[1]} lacks tensor '{dropped}'"):
        load_model(directory)


def test_a_tensor_in_two_safetensors_shards(sharded):
    directory, shards = sharded
    stolen = sorted(load_file(str(shards[0])))[0]
    _rewrite(shards[2], lambda t: t.update({stolen: torch.zeros(1)}))
    with pytest.raises(
        CheckpointError,
        match=rf"tensor '{stolen}' is in two shards .*{shards[0].name} and {shards[2].name}",
    ):
        load_model(directory)


def test_a_tensor_no_index_lists_is_kept_with_a_warning(sharded, caplog):
    directory, shards = sharded
    _rewrite(shards[0], lambda t: t.update({"pooler.extra.weight": torch.ones(2)}))
    with caplog.at_level(logging.WARNING, logger="clearformer.interop.hf.weights"):
        tensors = open_tensors(directory / "model.safetensors.index.json")
    assert torch.equal(tensors["pooler.extra.weight"], torch.ones(2))
    assert "does not list" in caplog.text and shards[0].name in caplog.text


def test_a_damaged_shard_is_named(sharded):
    directory, shards = sharded
    shards[2].write_bytes(shards[2].read_bytes()[:-4])
    with pytest.raises(CheckpointError, match=rf"cannot read {re.escape(str(shards[2]))}: "):
        load_model(directory)


# --- peak memory ----------------------------------------------------------------------------

# ~83M parameters, 332 MB as float32: large enough that the checkpoint held whole stands out
# from the interpreter's own noise, small enough to build in seconds.
BUILD = """
import sys, torch, transformers
torch.manual_seed(0)
config = transformers.Qwen3Config(
    vocab_size=32000, hidden_size=1024, intermediate_size=3072, num_hidden_layers=4,
    num_attention_heads=16, num_key_value_heads=8, head_dim=64, max_position_embeddings=512,
    pad_token_id=0,
)
transformers.Qwen3Model(config).save_pretrained(sys.argv[1])
# A tiny model of the family: what the measuring process loads first (see MEASURE).
tiny = transformers.Qwen3Config(
    vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
    num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
    pad_token_id=0,
)
transformers.Qwen3Model(tiny).save_pretrained(sys.argv[2])
"""

# The high-water mark of this process's resident set, reset once everything is imported
# (getrusage's ru_maxrss would not do: Linux carries it over from the parent across fork and
# exec, so the test process's own size would hide the load's).
MEASURE = """
import json, sys
from clearformer.bench.memory import _high_water_bytes, _reset_high_water, _rss_bytes
from clearformer.interop.hf import load_model, loading, weights

directory, reader, tiny = sys.argv[1], sys.argv[2], sys.argv[3]
if reader == "eager":  # the negative control: every tensor read before the model is filled
    loading.open_tensors = weights.read_tensors


def load(where):
    if reader == "bf16":  # built empty in bfloat16 and filled: the float32 model never exists
        return load_model(where, precision="bf16"), None
    if reader == "float32-then-bf16":  # the negative control: the float32 model, its copy
        from clearformer.precision import bf16_copy
        loaded = load_model(where)
        return loaded, bf16_copy(loaded.model)
    return load_model(where), None


# The first load in a process imports and sets up what every later one shares (about 80 MB:
# modules, kernels, the allocator's arenas): paid here, by the same load of a tiny model of
# the family, so that the figure is the large load's own.
load(tiny)
_reset_high_water()
before = _rss_bytes()
loaded, copy = load(directory)
print(json.dumps({"rise": _high_water_bytes() - before, "loaded": len(loaded.report.loaded)}))
"""


def _python(script: str, *args: str) -> str:
    """Run ``script`` in a fresh interpreter that imports this clearformer; its stdout."""
    source = str(Path(clearformer.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([source, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def large_checkpoint(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("qwen3-large")
    tiny = directory.parent / f"{directory.name}-tiny"
    _python(BUILD, str(directory), str(tiny))  # in its own process, so this one does not grow
    word_tokenizer(directory)
    word_tokenizer(tiny)
    return directory


@pytest.mark.skipif(
    not Path("/proc/self/status").is_file(), reason="reads VmHWM from /proc/self/status (Linux)"
)
@pytest.mark.parametrize("reader", ["lazy", "eager", "bf16", "float32-then-bf16"])
def test_peak_memory_of_a_load_is_the_model_and_little_more(large_checkpoint, reader):
    size = (large_checkpoint / "model.safetensors").stat().st_size
    assert size > 300e6
    tiny = large_checkpoint.parent / f"{large_checkpoint.name}-tiny"
    result = json.loads(_python(MEASURE, str(large_checkpoint), reader, str(tiny)).splitlines()[-1])
    ratio = result["rise"] / size
    if reader == "lazy":  # the model (1x) and at most one tensor besides
        assert ratio < 1.5, f"peak rose {ratio:.2f}x the checkpoint's size"
    elif reader == "bf16":  # the bfloat16 model (0.5x) and a block of rows besides; up to
        # 80 MB more in some runs (the allocator's and the kernel's page bookkeeping vary from
        # run to run), still far under the float32 model alone (1x) that it must never build
        assert ratio < 0.9, f"peak rose {ratio:.2f}x the checkpoint's size"
    else:  # the model and the whole checkpoint, or both models: the measurement sees it
        assert ratio > 1.4, f"the {reader} peak rose only {ratio:.2f}x"


# The loaders with a head (masked-LM: SPLADE; sequence classification: cross-encoders) read
# the checkpoint lazily too. BERT-shaped, ~75M parameters, about 300 MB as float32.
BUILD_HEADS = """
import sys, torch, transformers
torch.manual_seed(0)
config = transformers.BertConfig(
    vocab_size=32000, hidden_size=1024, intermediate_size=3072, num_hidden_layers=4,
    num_attention_heads=16, max_position_embeddings=512, num_labels=1,
)
transformers.BertForMaskedLM(config).save_pretrained(sys.argv[1] + "/masked_lm")
transformers.BertForSequenceClassification(config).save_pretrained(sys.argv[1] + "/classifier")
"""

MEASURE_HEADS = """
import json, sys
from clearformer.bench.memory import _high_water_bytes, _reset_high_water, _rss_bytes
from clearformer.interop.hf import heads, masked_lm, weights

directory, loader, reader = sys.argv[1], sys.argv[2], sys.argv[3]
if reader == "eager":  # the negative control: every tensor read before the model is filled
    heads.open_tensors = masked_lm.open_tensors = weights.read_tensors
_reset_high_water()
before = _rss_bytes()
if loader == "masked_lm":
    loaded = masked_lm.load_masked_lm(directory).loaded
else:
    loaded = heads.load_classifier(directory).loaded
print(json.dumps({"rise": _high_water_bytes() - before, "loaded": len(loaded.report.loaded)}))
"""


@pytest.fixture(scope="module")
def large_heads(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("bert-heads-large")
    _python(BUILD_HEADS, str(directory))
    for name in ("masked_lm", "classifier"):
        word_tokenizer(directory / name)
    return directory


@pytest.mark.skipif(
    not Path("/proc/self/status").is_file(), reason="reads VmHWM from /proc/self/status (Linux)"
)
@pytest.mark.parametrize("reader", ["lazy", "eager"])
@pytest.mark.parametrize("loader", ["masked_lm", "classifier"])
def test_peak_memory_of_a_head_load_is_the_model_and_little_more(large_heads, loader, reader):
    directory = large_heads / loader
    size = (directory / "model.safetensors").stat().st_size
    assert size > 250e6
    result = json.loads(_python(MEASURE_HEADS, str(directory), loader, reader).splitlines()[-1])
    assert result["loaded"] > 0
    ratio = result["rise"] / size
    if reader == "lazy":  # the model (1x) and at most one tensor besides
        assert ratio < 1.5, f"peak rose {ratio:.2f}x the checkpoint's size"
    else:
        assert ratio > 1.5, f"the eager reader's peak rose only {ratio:.2f}x"
