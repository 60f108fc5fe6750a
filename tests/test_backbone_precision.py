"""``precision=`` of the token-level applications (``MultiVectorEncoder``, ``BGEM3Encoder``):
bf16 per call against float32 by cosine (with a negative control: a bfloat16 backbone with one
weight scaled wrong fails the same check), a backbone loaded in bf16 equal bit for bit to the
per-call copy and holding no float32 linear weight, refusals before any work, and the server
loading these models in its own precision."""

from __future__ import annotations

import logging
import os

import pytest
import torch

from clearformer import BGEM3Encoder, MultiVectorEncoder
from clearformer.serve import ModelSpec
from clearformer.serve.token_models import load_served_model

from .multivector_helpers import TEXTS, bert_base, st_multivector_dir
from .xlmr_helpers import CORPUS, make_bge_m3

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("transformers")
pytest.importorskip("sentence_transformers")

FLOOR = 0.995  # the bf16 floor the dense encoders document (cosine to float32)


@pytest.fixture(scope="module")
def colbert_dir(tmp_path_factory):
    base = tmp_path_factory.mktemp("bert")
    bert_base(base)
    expansion = {"strategy": "fixed", "length": 12, "attend": False}  # the reference's route
    return st_multivector_dir(base, tmp_path_factory.mktemp("colbert"), expansion=expansion)


@pytest.fixture(scope="module")
def m3_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("bge-m3")
    make_bge_m3(path, seed=5, sparse=(0.3, 1.0), colbert=(0.3, 0.1))
    return path


def _min_cosine(ours: list[torch.Tensor], reference: list[torch.Tensor]) -> float:
    """Smallest cosine between matching token vectors (the same token counts required)."""
    assert [v.shape for v in ours] == [v.shape for v in reference]
    found = [
        torch.nn.functional.cosine_similarity(a, b, dim=-1)
        for a, b in zip(ours, reference, strict=True)
    ]
    return float(torch.cat(found).min())


def _linear_weight_dtypes(model) -> set[torch.dtype]:
    return {m.weight.dtype for m in model.modules() if isinstance(m, torch.nn.Linear)}


@pytest.mark.parametrize("side", ["query", "document"])
def test_multivector_bf16_call_is_close_to_float32_and_not_float32(colbert_dir, side):
    encoder = MultiVectorEncoder.from_pretrained(colbert_dir)
    encode = getattr(encoder, f"encode_{side}")
    full, half = encode(TEXTS), encode(TEXTS, precision="bfloat16")
    assert _min_cosine(half, full) >= FLOOR
    # It did run bfloat16: the vectors moved.
    assert max(float((a - b).abs().max()) for a, b in zip(half, full, strict=True) if len(a)) > 1e-4
    assert all(v.dtype == torch.float32 for v in half)
    assert encoder.precision_for("bf16").choice == "bf16"


def test_a_broken_bf16_backbone_fails_the_cosine_check(colbert_dir, monkeypatch):
    import clearformer.precision as precision

    made = precision.bf16_copy

    def broken(model):  # one weight's scale wrong: the negative control
        copy = made(model)
        with torch.no_grad():
            copy.encoder.layers[0].attn.out_proj.weight.mul_(3.0)
        return copy

    monkeypatch.setattr(precision, "bf16_copy", broken)
    encoder = MultiVectorEncoder.from_pretrained(colbert_dir)
    full = encoder.encode_document(TEXTS)
    assert _min_cosine(encoder.encode_document(TEXTS, precision="bf16"), full) < FLOOR


def test_multivector_loaded_in_bf16_holds_it_alone_and_equals_the_copy(colbert_dir):
    held = MultiVectorEncoder.from_pretrained(colbert_dir, precision="bf16")
    assert held.precision == "bf16"
    assert _linear_weight_dtypes(held.model) == {torch.bfloat16}
    per_call = MultiVectorEncoder.from_pretrained(colbert_dir)
    for side in ("query", "document"):
        ours = getattr(held, f"encode_{side}")(TEXTS)
        theirs = getattr(per_call, f"encode_{side}")(TEXTS, precision="bf16")
        assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))
    with pytest.raises(ValueError, match=r"loaded with precision='bf16'.*got 'float32'"):
        held.encode_query(TEXTS, precision="float32")


def test_bad_precisions_are_refused_before_any_work(colbert_dir, m3_dir, tmp_path):
    missing = tmp_path / "no-such-model"
    for cls in (MultiVectorEncoder, BGEM3Encoder):
        # The name is checked before the path is read.
        with pytest.raises(ValueError, match=r"precision must be one of .*got 'fp8'"):
            cls.from_pretrained(missing, precision="fp8")
        with pytest.raises(TypeError, match="precision must be one of"):
            cls.from_pretrained(missing, precision=16)
    encoder = MultiVectorEncoder.from_pretrained(colbert_dir)
    with pytest.raises(ValueError, match="got 'int8'"):
        encoder.encode_document(TEXTS, precision="int8")  # int8 is for dense embeddings
    with pytest.raises(ValueError, match="got 'half'"):
        BGEM3Encoder.from_pretrained(m3_dir).encode(TEXTS, precision="half")


def test_bge_m3_three_outputs_in_bf16_are_close_to_float32(m3_dir):
    texts = [*CORPUS, "hello hello world"]
    encoder = BGEM3Encoder.from_pretrained(m3_dir)
    full, half = encoder.encode(texts), encoder.encode(texts, precision="bf16")
    dense = torch.nn.functional.cosine_similarity(half.dense, full.dense, dim=-1)
    assert float(dense.min()) >= FLOOR
    assert not torch.equal(half.dense, full.dense)
    assert _min_cosine(half.colbert, full.colbert) >= FLOOR
    sparse = torch.nn.functional.cosine_similarity(
        half.sparse.to_dense(), full.sparse.to_dense(), dim=-1
    )
    assert float(sparse.min()) >= FLOOR

    held = BGEM3Encoder.from_pretrained(m3_dir, precision="bf16")
    assert held.precision == "bf16" and _linear_weight_dtypes(held.model) == {torch.bfloat16}
    again = held.encode(texts)
    assert torch.equal(again.dense, half.dense)
    assert all(torch.equal(a, b) for a, b in zip(again.colbert, half.colbert, strict=True))
    assert torch.equal(again.sparse.to_dense(), half.sparse.to_dense())
    # The heads stay float32 whatever the backbone's precision.
    assert held.colbert_linear.weight.dtype == torch.float32


def test_the_server_loads_token_models_in_its_precision(colbert_dir, m3_dir, caplog):
    for path in (colbert_dir, m3_dir):
        served = load_served_model(
            ModelSpec(str(path)), max_input_tokens=None, precision="bf16", backend="auto"
        )
        assert served.precision == "bf16" and served.info()["model_dtype"] == "bf16"
        assert served.model.precision == "bf16"
        assert _linear_weight_dtypes(served.model.model) == {torch.bfloat16}
    served = load_served_model(
        ModelSpec(str(colbert_dir)), max_input_tokens=None, precision="bf16", backend="auto"
    )
    prepared = served.prepare_tokens(TEXTS, output="colbert", side="document", field="inputs")
    answer = served.run(prepared.encodings, prepared.options)
    held = MultiVectorEncoder.from_pretrained(colbert_dir, precision="bf16")
    for got, want in zip(answer[:, 0], held.encode_document(TEXTS), strict=True):
        assert torch.equal(torch.from_numpy(got), want)
    with caplog.at_level(logging.WARNING):
        served = load_served_model(
            ModelSpec(str(colbert_dir)), max_input_tokens=None, precision="int8", backend="auto"
        )
    assert served.precision == "float32"
    assert "runs in float32 (int8 applies to embeddings)" in caplog.text
