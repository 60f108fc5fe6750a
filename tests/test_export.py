"""Export for deployment: ``torch.export`` of the padded path, ONNX under onnxruntime, the CLI.

The ONNX tests need the ``onnx`` extra (onnx, onnxscript, onnxruntime) and skip with a message
naming it when it is absent; the ``torch.export`` tests need only torch.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from clearformer.cli import main
from clearformer.export import ExportableEncoder, ExportError, export_onnx, export_program
from clearformer.export import module as export_module
from clearformer.export import onnx as export_onnx_module
from clearformer.text import TextEncoder

from .helpers import write_tiny_bert

os.environ.setdefault("HF_HUB_OFFLINE", "1")

SKIP = "the onnx extra is not installed (pip install 'clearformer[onnx]')"
TOLERANCE = 1e-4  # the parity bound
# Real texts of very different lengths: a ragged batch, padded up to the longest.
TEXTS = [
    "A cat sits on the mat.",
    "hi",
    "The quarterly report shows revenue grew by 12% while costs fell, mostly thanks to the new "
    "logistics contracts signed in March; analysts expect the trend to continue next year.",
    "Où est la gare ? 東京は大きい。",
    "def add(a, b):\n    return a + b  # sum",
    "Stock markets fell sharply today.",
]


@pytest.fixture(scope="module")
def ort():
    for name in ("onnx", "onnxscript"):
        pytest.importorskip(name, reason=SKIP)
    return pytest.importorskip("onnxruntime", reason=SKIP)


@pytest.fixture(scope="module")
def encoder() -> TextEncoder:
    return TextEncoder.from_pretrained()


@pytest.fixture(scope="module")
def tiny_encoder(tmp_path_factory) -> TextEncoder:
    """A random 1-layer BERT 16 wide: for the tests of how an export fails, which hold for any
    model and so need not trace the bundled one's six layers."""
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "cat", "sits", "on", "the", "mat"]
    return TextEncoder.from_pretrained(write_tiny_bert(tmp_path_factory.mktemp("tiny"), words))


@pytest.fixture(scope="module")
def exported(ort, encoder, tmp_path_factory):
    """The bundled MiniLM exported once (traced on a 2 x 8 batch), with pooling."""
    return export_onnx(encoder, tmp_path_factory.mktemp("export") / "minilm")


@pytest.fixture(scope="module")
def session(ort, exported):
    return ort.InferenceSession(str(exported.model), providers=["CPUExecutionProvider"])


def feed_for(encoder: TextEncoder, texts: list[str]) -> dict[str, np.ndarray]:
    batch = encoder.tokenize(texts)
    return {
        "input_ids": batch.input_ids.numpy(),
        "attention_mask": batch.attention_mask.long().numpy(),
        "token_type_ids": batch.token_type_ids.numpy(),
    }


def clearformer_outputs(encoder: TextEncoder, feed: dict[str, np.ndarray]):
    """The model's own forward pass (its default backend: packed rows on a ragged batch)."""
    ids = torch.from_numpy(feed["input_ids"])
    mask = torch.from_numpy(feed["attention_mask"]).bool()
    types = torch.from_numpy(feed["token_type_ids"])
    with torch.inference_mode():
        hidden = encoder.model(ids, mask, types)
        pooled = torch.nn.functional.normalize(encoder.pool(hidden, mask), dim=-1)
    return hidden.numpy(), pooled.numpy(), mask.numpy()


# --- ONNX under onnxruntime -----------------------------------------------------------------


def test_onnx_matches_clearformer_on_a_ragged_batch(encoder, session):
    feed = feed_for(encoder, TEXTS)  # 6 x T, T far from the traced 8 and the checked 26
    assert feed["input_ids"].shape[0] == 6 and feed["input_ids"].shape[1] > 30
    hidden, pooled = session.run(["last_hidden_state", "sentence_embedding"], feed)
    want_hidden, want_pooled, real = clearformer_outputs(encoder, feed)
    assert not real.all()  # some rows are padded
    np.testing.assert_allclose(hidden[real], want_hidden[real], atol=TOLERANCE, rtol=0)
    assert (hidden[~real] == 0).all()  # padded positions are zero, as clearformer's
    np.testing.assert_allclose(pooled, want_pooled, atol=TOLERANCE, rtol=0)
    # And what TextEncoder.encode returns, batch-mates and batch plan included.
    np.testing.assert_allclose(pooled, encoder.encode(TEXTS), atol=TOLERANCE, rtol=0)


def test_onnx_sentence_embedding_matches_sentence_transformers(encoder, session):
    st = pytest.importorskip("sentence_transformers")
    from clearformer.interop.hf import bundled_model_dir

    model = st.SentenceTransformer(str(bundled_model_dir()), device="cpu")
    want = model.encode(TEXTS, convert_to_numpy=True, normalize_embeddings=False)
    (pooled,) = session.run(["sentence_embedding"], feed_for(encoder, TEXTS))
    np.testing.assert_allclose(pooled, want, atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize(
    "texts",
    [
        ["x"],  # batch 1, 3 tokens
        [" ".join(["word"] * 200)],  # batch 1, 202 tokens
        TEXTS + TEXTS[::-1] + ["one more"],  # batch 13
    ],
    ids=["batch-1-short", "batch-1-long", "batch-13"],
)
def test_onnx_axes_are_dynamic(encoder, session, texts):
    feed = feed_for(encoder, texts)
    hidden, pooled = session.run(None, feed)
    want_hidden, want_pooled, real = clearformer_outputs(encoder, feed)
    assert hidden.shape == want_hidden.shape
    np.testing.assert_allclose(hidden[real], want_hidden[real], atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(pooled, want_pooled, atol=TOLERANCE, rtol=0)


def left_padded(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The same batch with every row's padding moved to its left."""
    out = {name: value.copy() for name, value in feed.items()}
    for row, mask in enumerate(feed["attention_mask"]):
        shift = int((mask == 0).sum())
        for name in out:
            out[name][row] = np.roll(feed[name][row], shift)
    return out


def test_onnx_and_program_match_clearformer_on_a_left_padded_batch(encoder, session):
    """Positions count each row's real tokens: a row padded on the left gets the outputs it
    has padded on the right (tokenizers pad either way)."""
    right = feed_for(encoder, TEXTS)
    left = left_padded(right)
    assert not (left["attention_mask"][:, 0] == 1).all()  # some rows start with padding
    want_hidden, want_pooled, real = clearformer_outputs(encoder, right)
    hidden, pooled = session.run(["last_hidden_state", "sentence_embedding"], left)
    real_left = left["attention_mask"].astype(bool)
    np.testing.assert_allclose(hidden[real_left], want_hidden[real], atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(pooled, want_pooled, atol=TOLERANCE, rtol=0)
    program = export_program(encoder.model, pooling="mean", normalize=True)
    args = [torch.from_numpy(left[n]) for n in ("input_ids", "attention_mask", "token_type_ids")]
    with torch.no_grad():
        _, vectors = program.module()(*args)
    np.testing.assert_allclose(vectors.numpy(), want_pooled, atol=TOLERANCE, rtol=0)


def test_onnx_fully_padded_row_gives_zeros(encoder, session):
    feed = feed_for(encoder, ["A cat sits on the mat.", "hi"])
    feed["attention_mask"][1] = 0  # a row with no real token at all
    hidden, pooled = session.run(None, feed)
    assert np.isfinite(hidden).all() and np.isfinite(pooled).all()
    assert (hidden[1] == 0).all() and (pooled[1] == 0).all()
    want_hidden, want_pooled, real = clearformer_outputs(encoder, feed)
    np.testing.assert_allclose(hidden[0], want_hidden[0], atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(pooled, want_pooled, atol=TOLERANCE, rtol=0)


def test_export_directory_holds_graph_tokenizer_and_configs(ort, encoder, exported):
    import onnx

    names = set(exported.files)
    assert {
        "model.onnx",
        "clearformer_export.json",
        "config.json",
        "tokenizer.json",
        "vocab.txt",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "modules.json",
        "sentence_bert_config.json",
        "1_Pooling/config.json",
    } <= names
    for name in names:
        assert (exported.path / name).is_file()
    for name in names - {"model.onnx", "clearformer_export.json"}:
        assert (exported.path / name).read_bytes() == (encoder.path / name).read_bytes()
    # Nothing else was left beside the export (no staging folder).
    assert [p.name for p in exported.path.parent.iterdir()] == [exported.path.name]

    graph = onnx.load(str(exported.model)).graph
    shapes = {
        v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in [*graph.input, *graph.output]
    }
    assert shapes == {
        "input_ids": ["batch", "sequence"],
        "attention_mask": ["batch", "sequence"],
        "token_type_ids": ["batch", "sequence"],
        "last_hidden_state": ["batch", "sequence", 384],
        "sentence_embedding": ["batch", 384],
    }
    info = json.loads((exported.path / "clearformer_export.json").read_text())
    assert info["pooling"] == "mean" and info["normalize"] is True
    assert info["max_length"] == encoder.max_length == 256
    assert info["check"]["max_abs_diff"]["last_hidden_state"] <= TOLERANCE
    assert info["check"]["max_abs_diff"]["sentence_embedding"] <= TOLERANCE
    assert exported.max_abs_diff == info["check"]["max_abs_diff"]


def test_copied_tokenizer_gives_clearformer_ids(encoder, exported):
    from tokenizers import Tokenizer

    # The recipe of docs/export.md: tokenizer.json with the export's max_length, padded to the
    # longest text of the batch (all-MiniLM-L6-v2's file itself pads and truncates to 128).
    info = json.loads((exported.path / "clearformer_export.json").read_text())
    tokenizer = Tokenizer.from_file(str(exported.path / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(info["max_length"])
    texts = [*TEXTS, " ".join(["word"] * 300)]  # one past max_length
    for text, encoding in zip(texts, encoder.tokenizer.encode(texts), strict=True):
        assert tokenizer.encode(text).ids == list(encoding.ids)
    assert len(tokenizer.encode(texts[-1]).ids) == 256


def test_hidden_states_only_export(ort, encoder, tmp_path):
    result = export_onnx(encoder, tmp_path / "plain", pooling=False, backend="math")
    assert result.outputs == ("last_hidden_state",) and result.pooling is None
    session = ort.InferenceSession(str(result.model), providers=["CPUExecutionProvider"])
    feed = feed_for(encoder, TEXTS[:4])
    (hidden,) = session.run(None, feed)
    want_hidden, _, real = clearformer_outputs(encoder, feed)
    np.testing.assert_allclose(hidden[real], want_hidden[real], atol=TOLERANCE, rtol=0)


def test_a_graph_with_static_axes_is_refused_and_nothing_is_written(
    ort, tiny_encoder, tmp_path, monkeypatch
):
    # Traced without dynamic shapes, the graph takes only 2 x 8 batches: the check on the
    # 4 x 26 batch must catch it before the directory appears.
    monkeypatch.setattr(export_module, "dynamic_shapes_for", lambda module: None)
    target = tmp_path / "static"
    with pytest.raises(ExportError, match="fails under onnxruntime on a 4 x 26 batch"):
        export_onnx(tiny_encoder, target)
    assert list(tmp_path.iterdir()) == []


def test_a_failed_export_keeps_the_earlier_one(ort, tiny_encoder, tmp_path, monkeypatch):
    target = tmp_path / "earlier"
    target.mkdir()
    (target / "model.onnx").write_bytes(b"the earlier export")

    def differ(*args, **kwargs):
        raise ExportError("outputs differ")

    monkeypatch.setattr(export_onnx_module, "_check_parity", differ)
    with pytest.raises(ExportError, match="outputs differ"):
        export_onnx(tiny_encoder, target, overwrite=True)
    assert [p.name for p in tmp_path.iterdir()] == ["earlier"]
    assert [p.name for p in target.iterdir()] == ["model.onnx"]
    assert (target / "model.onnx").read_bytes() == b"the earlier export"


def test_export_onnx_refuses_bad_arguments(ort, encoder, tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(FileExistsError, match="not empty"):
        export_onnx(encoder, tmp_path / "full")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        export_onnx(encoder, tmp_path / "no" / "such")
    with pytest.raises(ValueError, match="opset must be an int >= 18"):
        export_onnx(encoder, tmp_path / "a", opset=12)
    with pytest.raises(ValueError, match="no pooling config"):
        export_onnx(encoder.model, tmp_path / "a")
    with pytest.raises(ValueError, match="export backend must be one of"):
        export_onnx(encoder, tmp_path / "a", backend="varlen")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"]


# --- torch.export ---------------------------------------------------------------------------


@pytest.mark.parametrize("strict", [False, True], ids=["non-strict", "strict-dynamo"])
def test_torch_export_program_equals_eager(encoder, strict):
    # strict=True traces with TorchDynamo, which refuses any graph break.
    program = export_program(encoder.model, pooling="mean", normalize=True, strict=strict)
    assert isinstance(program, torch.export.ExportedProgram)
    # No host read of a tensor value is left in the graph (the id and mask checks are not).
    targets = {str(node.target) for node in program.graph.nodes if node.op == "call_function"}
    assert "aten.item.default" not in targets
    assert "aten._local_scalar_dense.default" not in targets
    # The program is portable: plain linear ops, not the oneDNN fused ones eager inference uses.
    assert "aten.linear.default" in targets
    assert not [t for t in targets if "mkldnn" in t]
    eager = ExportableEncoder(encoder.model, pooling="mean", normalize=True)
    for texts in (TEXTS, TEXTS[:1]):  # other shapes than the traced 2 x 8
        batch = encoder.tokenize(texts)
        args = (batch.input_ids, batch.attention_mask.long(), batch.token_type_ids)
        with torch.no_grad():
            got, want = program.module()(*args), eager(*args)
        # Eager inference on CPU runs the linear layers fused (oneDNN), the program plain
        # ones: the same sums in another order, equal to float32 rounding.
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(
            got[1], torch.from_numpy(encoder.encode(texts)), atol=1e-5, rtol=1e-5
        )
    assert not encoder.model.training  # the caller's mode is kept


def test_export_keeps_a_training_model_training(encoder):
    model = encoder.model
    model.train()
    try:
        export_program(model)
        assert model.training and all(m.training for m in model.modules())
    finally:
        model.eval()


# --- ModernBERT: rotary positions, local and global layers ------------------------------------


@pytest.fixture(scope="module")
def modernbert(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    from clearformer.interop.hf.loading import load_model

    config = transformers.ModernBertConfig(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=4,  # layers 0 and 3 global, 1 and 2 local
        num_attention_heads=4,
        local_attention=16,
        global_attn_every_n_layers=3,
        max_position_embeddings=2048,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        cls_token_id=1,
        sep_token_id=2,
    )
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("modernbert")
    transformers.ModernBertModel(config).save_pretrained(path)
    (path / "vocab.txt").write_text(
        "\n".join(["[PAD]", "[CLS]", "[SEP]", "[UNK]"] + [f"w{i}" for i in range(93)])
    )
    return load_model(path).model.eval()


def test_modernbert_exports_on_math_and_matches_under_onnxruntime(ort, modernbert, tmp_path):
    # Past 512 tokens sdpa runs local layers slab by slab: a branch on T, so math is chosen.
    with pytest.raises(ValueError, match="backend='math'"):
        ExportableEncoder(modernbert, backend="sdpa")
    result = export_onnx(modernbert, tmp_path / "modernbert", pooling=False)
    assert result.files == ("clearformer_export.json", "model.onnx")
    info = json.loads((tmp_path / "modernbert" / "clearformer_export.json").read_text())
    assert info["attention"]["backend"] == "math"
    session = ort.InferenceSession(str(result.model), providers=["CPUExecutionProvider"])
    lengths = torch.tensor([700, 40, 3])  # beyond the window and past 512 tokens
    T = int(lengths.max())
    mask = torch.arange(T)[None] < lengths[:, None]
    ids = torch.randint(3, 97, (3, T), generator=torch.Generator().manual_seed(1))
    ids = ids.masked_fill(~mask, 0)
    (hidden,) = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.long().numpy()})
    with torch.inference_mode():
        want = modernbert(ids, mask)  # packed rows, local layers per sequence
    np.testing.assert_allclose(hidden[mask.numpy()], want[mask].numpy(), atol=TOLERANCE, rtol=0)


def test_mpnet_relative_bias_exports_on_math(ort, tmp_path):
    transformers = pytest.importorskip("transformers")
    from clearformer.interop.hf.loading import load_model

    config = transformers.MPNetConfig(
        vocab_size=120,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=260,
        relative_attention_num_buckets=32,
    )
    torch.manual_seed(0)
    transformers.MPNetModel(config).save_pretrained(tmp_path / "mpnet")
    words = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"] + [f"w{i}" for i in range(115)]
    (tmp_path / "mpnet" / "vocab.txt").write_text("\n".join(words) + "\n")
    model = load_model(tmp_path / "mpnet").model.eval()
    result = export_onnx(model, tmp_path / "onnx", pooling=False)
    session = ort.InferenceSession(str(result.model), providers=["CPUExecutionProvider"])
    lengths = torch.tensor([200, 37, 5])  # distances past the bias's max_distance of 128
    mask = torch.arange(200)[None] < lengths[:, None]
    ids = torch.randint(3, 120, (3, 200), generator=torch.Generator().manual_seed(1))
    ids = ids.masked_fill(~mask, 1)
    ids[1, 4] = ids[2, 2] = 1  # a pad id inside a text: MPNet's positions skip it
    (hidden,) = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.long().numpy()})
    with torch.inference_mode():
        want = model(ids, mask)
        # transformers' own MPNet, for the positions past the pad ids
        reference = transformers.MPNetModel.from_pretrained(tmp_path / "mpnet").eval()
        theirs = reference(input_ids=ids, attention_mask=mask.long()).last_hidden_state
    np.testing.assert_allclose(hidden[mask.numpy()], want[mask].numpy(), atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(hidden[mask.numpy()], theirs[mask].numpy(), atol=TOLERANCE, rtol=0)


# --- the command line -----------------------------------------------------------------------


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_exports_the_bundled_model(ort, encoder, tmp_path, capsys):
    target = tmp_path / "cli"
    code, out, err = _run(capsys, "export", "--onnx", str(target), "--no-pooling")
    assert code == 0, err
    assert out == ""
    assert "export: loading the bundled model" in err
    assert "export: checking the graph under onnxruntime" in err
    assert f"export: wrote {target}" in err
    info = json.loads((target / "clearformer_export.json").read_text())
    assert info["outputs"] == ["last_hidden_state"]
    assert {"model.onnx", "tokenizer.json", "vocab.txt", "config.json"} <= {
        p.name for p in target.iterdir()
    }
    session = ort.InferenceSession(str(target / "model.onnx"), providers=["CPUExecutionProvider"])
    feed = feed_for(encoder, TEXTS[:3])
    (hidden,) = session.run(None, feed)
    want_hidden, _, real = clearformer_outputs(encoder, feed)
    np.testing.assert_allclose(hidden[real], want_hidden[real], atol=TOLERANCE, rtol=0)


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--onnx", "{tmp}/full"], "--onnx: {tmp}/full exists and is not empty"),
        (["--onnx", "{tmp}/no/such"], "directory {tmp}/no does not exist"),
        (["--onnx", "{tmp}/file.txt"], "exists and is not a directory"),
        (["--onnx", "{tmp}/a", "--model", "{tmp}/missing"], "--model: checkpoint directory not"),
        (["--onnx", "{tmp}/a", "--model", "{tmp}/full"], "config.json"),
        (["--onnx", "{tmp}/a", "--opset", "11"], "--opset must be at least 18, got 11"),
    ],
    ids=["not-empty", "no-parent", "a-file", "no-model", "not-a-checkpoint", "old-opset"],
)
def test_cli_refuses_bad_arguments(ort, tmp_path, capsys, argv, message):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    (tmp_path / "file.txt").write_text("x")
    argv = [a.format(tmp=tmp_path) for a in argv]
    code, out, err = _run(capsys, "export", *argv)
    assert code == 2
    assert out == "" and "Traceback" not in err
    assert message.format(tmp=tmp_path) in err, err
    assert err.count("\n") <= 2  # a loading line at most, then the error
    assert not (tmp_path / "a").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to read-only directories")
def test_cli_refuses_a_read_only_parent(ort, tmp_path, capsys):
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o500)
    try:
        code, _, err = _run(capsys, "export", "--onnx", str(parent / "x"))
    finally:
        parent.chmod(0o700)
    assert code == 2 and "is not writable" in err


def test_cli_names_the_extra_when_onnx_is_missing(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(export_onnx_module, "missing_packages", lambda verify=True: ["onnxruntime"])
    code, out, err = _run(capsys, "export", "--onnx", str(tmp_path / "x"))
    assert code == 2 and out == "" and "Traceback" not in err
    assert "needs onnxruntime, which is not installed" in err
    assert "pip install 'clearformer[onnx]'" in err
    assert not (tmp_path / "x").exists()


def test_cli_requires_the_onnx_directory(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["export"])
    assert exit_info.value.code == 2
    assert "--onnx" in capsys.readouterr().err


def test_the_python_api_refuses_to_export_over_its_own_checkpoint(ort, tiny_encoder):
    """overwrite=True on the checkpoint's own folder (or one holding it) would replace the
    weights being exported: refused before anything is written, as the CLI refuses it."""
    source = tiny_encoder.path
    before = sorted(p.name for p in source.iterdir())
    for out in (source, source.parent):
        with pytest.raises(ValueError, match="holds the checkpoint it exports"):
            export_onnx(tiny_encoder, out, overwrite=True)
    assert sorted(p.name for p in source.iterdir()) == before
