"""sentence-transformers' modules after the pooling: Dense (EmbeddingGemma's up-and-down
projection), Normalize, the Matryoshka cut (``truncate_dim``, ``dimensions=``), against
``SentenceTransformer(dir).encode`` on directories written by sentence-transformers itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from clearformer import TextEncoder
from clearformer.heads.sentence import DenseConfig, SentenceHead, SentenceHeadConfig
from clearformer.interop.hf import CheckpointError

from .family_helpers import BACKENDS, TEXTS, assert_batch_invariant, sentence_dir, st_encode
from .test_pretrained_checkpoints import make_checkpoint

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("transformers")
st = pytest.importorskip("sentence_transformers")

# BERT width 32 -> 96 (tanh, bias) -> 32 (identity, no bias), as EmbeddingGemma's 768 -> 3072
# -> 768 (identity, no bias) at a smaller scale.
DENSE = [(32, 96, True, "Tanh"), (96, 32, False, None)]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    path = tmp_path_factory.mktemp("bert")
    make_checkpoint("bert", path)
    return path


@pytest.fixture(scope="module")
def dense_dir(base, tmp_path_factory):
    return sentence_dir(base, tmp_path_factory.mktemp("dense"), dense=DENSE, normalize=True)


@pytest.fixture(scope="module")
def plain_dir(base, tmp_path_factory):
    """Dense modules and no Normalize: lengths carry through."""
    return sentence_dir(base, tmp_path_factory.mktemp("plain"), dense=DENSE[:1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_dense_modules_equal_sentence_transformers(dense_dir, backend):
    kinds = [
        m["type"].rsplit(".", 1)[-1] for m in json.loads((dense_dir / "modules.json").read_text())
    ]
    assert kinds == ["Transformer", "Pooling", "Dense", "Dense", "Normalize"]
    ours = TextEncoder.from_pretrained(dense_dir, backend=backend)
    assert ours.dim == 32 and ours.normalize and len(ours.head.config.steps) == 2
    want = st_encode(dense_dir, TEXTS)
    np.testing.assert_allclose(ours.encode(TEXTS), want, atol=1e-5, rtol=0)
    # Negative control: the pooled vector without the Dense modules is something else.
    plain = ours.pool(*_states(ours, TEXTS))
    assert np.abs(torch.nn.functional.normalize(plain, dim=-1).numpy() - want).max() > 1e-2


def _states(encoder, texts):
    batch = encoder.tokenize(texts)
    with torch.no_grad():
        return encoder.model(batch.input_ids, batch.attention_mask, batch.token_type_ids), (
            batch.attention_mask
        )


def test_dense_without_normalize_keeps_lengths(plain_dir):
    ours = TextEncoder.from_pretrained(plain_dir)
    assert ours.dim == 96 and not ours.normalize
    got, want = ours.encode(TEXTS), st_encode(plain_dir, TEXTS)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    assert np.abs(np.linalg.norm(got, axis=1) - 1).max() > 1e-2  # really not normalised


@pytest.mark.parametrize("dims", [1, 8, 31, 32])
def test_dimensions_cut_then_normalise_as_sentence_transformers(dense_dir, dims):
    ours = TextEncoder.from_pretrained(dense_dir)
    got = ours.encode(TEXTS, dimensions=dims)
    assert got.shape == (len(TEXTS), dims)
    want = st_encode(dense_dir, TEXTS, truncate_dim=dims, normalize_embeddings=True)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1, atol=1e-5)
    # sentence-transformers' default (its Normalize before the cut) points the same way.
    loose = st_encode(dense_dir, TEXTS, truncate_dim=dims)
    np.testing.assert_allclose(got, loose / np.linalg.norm(loose, axis=1, keepdims=True), atol=1e-5)


def test_dimensions_without_normalisation_only_cut(plain_dir):
    ours = TextEncoder.from_pretrained(plain_dir)
    got = ours.encode(TEXTS, dimensions=40)
    np.testing.assert_allclose(got, st_encode(plain_dir, TEXTS, truncate_dim=40), atol=1e-5)
    np.testing.assert_allclose(got, ours.encode(TEXTS)[:, :40], atol=1e-6, rtol=0)


def test_truncate_dim_is_the_default_of_calls(dense_dir, tmp_path):
    ours = TextEncoder.from_pretrained(dense_dir, truncate_dim=16)
    assert ours.dim == 16
    np.testing.assert_allclose(
        ours.encode(TEXTS),
        st_encode(dense_dir, TEXTS, truncate_dim=16, normalize_embeddings=True),
        atol=1e-5,
    )
    assert ours.encode(TEXTS, dimensions=8).shape == (len(TEXTS), 8)  # a call overrides it
    # ... and a directory may record it.
    copy = _copy(dense_dir, tmp_path)
    cfg = json.loads((copy / "config_sentence_transformers.json").read_text())
    (copy / "config_sentence_transformers.json").write_text(json.dumps({**cfg, "truncate_dim": 8}))
    assert TextEncoder.from_pretrained(copy).dim == 8


def _copy(path, tmp_path):
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(path, out)
    return out


@pytest.mark.parametrize("bad", [0, 33, -1])
def test_dimensions_outside_the_width_are_refused(dense_dir, bad):
    ours = TextEncoder.from_pretrained(dense_dir)
    with pytest.raises(ValueError, match=r"dimensions must be in \[1, 32\].*got " + str(bad)):
        ours.encode(TEXTS, dimensions=bad)
    with pytest.raises(TypeError, match="dimensions must be a positive int"):
        ours.encode(TEXTS, dimensions=8.0)
    with pytest.raises(ValueError, match="truncate_dim must be in"):
        TextEncoder.from_pretrained(dense_dir, truncate_dim=bad)


def test_matryoshka_list_from_config_json_is_enforced(dense_dir, tmp_path):
    copy = _copy(dense_dir, tmp_path)
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "matryoshka_dimensions": [8, 16, 32]}))
    ours = TextEncoder.from_pretrained(copy)
    assert ours.encode(TEXTS, dimensions=16).shape == (len(TEXTS), 16)
    with pytest.raises(ValueError, match=r"Matryoshka dimensions \[8, 16, 32\], got 12"):
        ours.encode(TEXTS, dimensions=12)
    (copy / "config.json").write_text(json.dumps({**config, "matryoshka_dimensions": [8, 64]}))
    with pytest.raises(CheckpointError, match="matryoshka_dimensions.*at most the embedding width"):
        TextEncoder.from_pretrained(copy)
    (copy / "config.json").write_text(json.dumps({**config, "matryoshka_dimensions": "all"}))
    with pytest.raises(CheckpointError, match="config.json 'matryoshka_dimensions' must be"):
        TextEncoder.from_pretrained(copy)


def _dense_config(path, index=0):
    modules = json.loads((path / "modules.json").read_text())
    folder = path / [m["path"] for m in modules if m["type"].endswith("Dense")][index]
    return folder, json.loads((folder / "config.json").read_text())


@pytest.mark.parametrize(
    "change, message",
    [
        ({"activation_function": "mypackage.Swish"}, "'activation_function'='mypackage.Swish'"),
        ({"in_features": 31}, "'in_features' must be 32"),
        ({"out_features": 95}, r"'linear.weight' has shape \(96, 32\), expected \(95, 32\)"),
        ({"module_input_name": "token_embeddings"}, "'module_input_name' must be"),
        ({"bias": False}, "must hold exactly"),
    ],
)
def test_bad_dense_configs_name_the_file_and_field(dense_dir, tmp_path, change, message):
    copy = _copy(dense_dir, tmp_path)
    folder, config = _dense_config(copy)
    (folder / "config.json").write_text(json.dumps({**config, **change}))
    with pytest.raises(CheckpointError, match=message) as info:
        TextEncoder.from_pretrained(copy)
    assert str(folder / "config.json") in str(info.value) or str(folder) in str(info.value)


def test_dense_without_weights_and_modules_out_of_order(dense_dir, tmp_path):
    copy = _copy(dense_dir, tmp_path)
    folder, _ = _dense_config(copy)
    (folder / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="lacks its weights"):
        TextEncoder.from_pretrained(copy)
    copy2 = _copy(dense_dir, tmp_path / "two")
    modules = json.loads((copy2 / "modules.json").read_text())
    modules[1], modules[2] = modules[2], modules[1]  # a Dense before the pooling
    (copy2 / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(CheckpointError, match="must list the Transformer, a Pooling, then"):
        TextEncoder.from_pretrained(copy2)


def test_a_normalize_between_dense_modules_runs_in_place(base, tmp_path):
    """Modules run in their order: a Normalize in the middle is a step, not the default."""
    import sentence_transformers as st
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling

    torch.manual_seed(3)
    transformer = st.sentence_transformer.modules.Transformer(str(base))
    modules = [transformer, Pooling(32), Normalize(), Dense(32, 16, activation_function=None)]
    st.SentenceTransformer(modules=modules, device="cpu").save(str(tmp_path / "mid"))
    ours = TextEncoder.from_pretrained(tmp_path / "mid")
    assert ours.head.config.steps[0] == "normalize" and not ours.normalize
    np.testing.assert_allclose(ours.encode(TEXTS), st_encode(tmp_path / "mid", TEXTS), atol=1e-5)


def test_save_pretrained_writes_the_dense_modules(dense_dir, tmp_path):
    ours = TextEncoder.from_pretrained(dense_dir)
    with torch.no_grad():
        ours.head.dense[0].linear.bias.add_(0.5)  # a change after loading is what gets saved
    out = ours.save_pretrained(tmp_path / "saved")
    back = TextEncoder.from_pretrained(out)
    np.testing.assert_allclose(back.encode(TEXTS), ours.encode(TEXTS), atol=1e-6, rtol=0)
    np.testing.assert_allclose(st_encode(out, TEXTS), ours.encode(TEXTS), atol=1e-5, rtol=0)


@pytest.mark.parametrize("backend", ["math", "varlen"])
def test_each_text_alone_equals_it_in_the_batch(dense_dir, backend):
    ours = TextEncoder.from_pretrained(dense_dir, backend=backend)
    assert_batch_invariant(ours, TEXTS)
    assert_batch_invariant(ours, TEXTS, dimensions=8)


def test_head_config_checks_its_chain():
    with pytest.raises(ValueError, match=r"steps\[1\].in_features must be 8"):
        SentenceHeadConfig(4, steps=(DenseConfig(4, 8), DenseConfig(7, 2)))
    with pytest.raises(ValueError, match="DenseConfig.activation must be one of"):
        DenseConfig(4, 8, activation="swish")
    head = SentenceHead(
        SentenceHeadConfig(4, "lasttoken", (DenseConfig(4, 6, activation="identity"),))
    )
    hidden, mask = torch.randn(2, 3, 4), torch.tensor([[True, True, False], [False, True, True]])
    want = head.dense[0].linear(torch.stack([hidden[0, 1], hidden[1, 2]]))
    torch.testing.assert_close(head(hidden, mask), want)


def _cli(*args, check=False):
    command = [sys.executable, "-m", "clearformer", *args]
    return subprocess.run(command, capture_output=True, text=True, check=check, timeout=300)


def test_cli_encode_dimensions(dense_dir, tmp_path):
    out = tmp_path / "e.npy"
    done = _cli(
        "encode", "--model", str(dense_dir), "--dimensions", "8", "-o", str(out), *TEXTS[:2]
    )
    assert done.returncode == 0, done.stderr
    got = np.load(out)
    want = st_encode(dense_dir, TEXTS[:2], truncate_dim=8, normalize_embeddings=True)
    np.testing.assert_allclose(got, want, atol=1e-5)
    bad = _cli("encode", "--model", str(dense_dir), "--dimensions", "64", "hello")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "--dimensions must be in [1, 32]" in bad.stderr and len(bad.stderr.splitlines()) == 1


def test_cross_encoder_prompts_go_before_the_first_text(tmp_path):
    """sentence-transformers' cross-encoder prompts: named in config_sentence_transformers.json,
    chosen per call (or the default), put before each pair's first text."""
    from clearformer import CrossEncoder

    from .test_sequence_classification import make_classifier

    make_classifier("bert", tmp_path, num_labels=1)
    prompts = {"prompts": {"q": "w1 w2 ", "none": ""}, "default_prompt_name": None}
    (tmp_path / "config_sentence_transformers.json").write_text(json.dumps(prompts))
    pairs = [("w3 w4", "w5"), ("w6", "w7 w8 w9")]
    ours = CrossEncoder.from_pretrained(tmp_path)
    # sentence-transformers reads the file only beside a modules.json: give them to it.
    reference = st.CrossEncoder(str(tmp_path), prompts=prompts["prompts"])
    assert ours.prompts.prompts == prompts["prompts"]
    got = ours.predict(pairs, prompt_name="q")
    np.testing.assert_allclose(got, reference.predict(pairs, prompt_name="q"), atol=1e-5)
    np.testing.assert_allclose(ours.predict(pairs, prompt="w1 w2 "), got, atol=1e-6, rtol=0)
    assert np.abs(got - ours.predict(pairs)).max() > 1e-4  # the prompt changed the scores
    with pytest.raises(ValueError, match=r"prompt_name must be one of the checkpoint's prompts"):
        ours.predict(pairs, prompt_name="passage")
    (tmp_path / "config_sentence_transformers.json").write_text(
        json.dumps({**prompts, "default_prompt_name": "q"})
    )
    again = CrossEncoder.from_pretrained(tmp_path)
    np.testing.assert_allclose(again.predict(pairs), got, atol=1e-6, rtol=0)


def test_serve_refuses_dimensions_outside_the_matryoshka_list(dense_dir, tmp_path):
    for module in ("uvicorn", "starlette", "prometheus_client", "httpx"):
        pytest.importorskip(module)
    from starlette.testclient import TestClient

    from clearformer.serve import ModelSpec, ServeConfig, create_app

    copy = _copy(dense_dir, tmp_path)
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "matryoshka_dimensions": [8, 16, 32]}))
    app = create_app(ServeConfig(workers=1), [ModelSpec(str(copy), "m")])
    with TestClient(app) as client:  # entered: the lifespan loads the model, in the background
        import time

        deadline = time.monotonic() + 120
        while client.get("/health").status_code == 503 and time.monotonic() < deadline:
            time.sleep(0.1)
        ok = client.post("/embed", json={"inputs": ["the cat"], "dimensions": 16})
        assert ok.status_code == 200 and len(ok.json()[0]) == 16
        want = TextEncoder.from_pretrained(copy).encode(["the cat"], dimensions=16)
        np.testing.assert_allclose(np.asarray(ok.json(), dtype=np.float32), want, atol=1e-6)
        bad = client.post("/embed", json={"inputs": ["the cat"], "dimensions": 12})
        assert bad.status_code == 422
        assert "Matryoshka dimensions [8, 16, 32], got 12" in bad.json()["error"]


def test_a_text_with_dense_modules_gets_its_bits_in_any_batch(dense_dir):
    from .helpers import intra_op_threads

    ours = TextEncoder.from_pretrained(dense_dir)
    # One thread (as serve's shared batches run; see docs/serving.md), workers=1: each call
    # one forward pass. On CPUs whose kernels round a one-row product otherwise than a
    # several-row one (AMD Zen 4 does, 1e-7), whole-batch Dense products fail this test.
    with intra_op_threads(1):
        together = ours.encode(TEXTS, workers=1)
        for i, text in enumerate(TEXTS):
            np.testing.assert_array_equal(ours.encode([text], workers=1)[0], together[i])
