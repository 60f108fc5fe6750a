"""The encode benchmark's ONNX Runtime rows compute the same embeddings as clearformer.

``benchmarks/onnxruntime_encoder.py`` builds its models from the bundled checkpoint; a broken
export, a fusion that stopped applying or a pooling slip would make the benchmark compare
against something else than ONNX Runtime running this model.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime", reason="the ONNX Runtime rows need onnxruntime")
pytest.importorskip("onnx", reason="the ONNX Runtime rows need onnx")
pytest.importorskip("transformers", reason="the export starts from transformers' BertModel")

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import encode_throughput  # noqa: E402
import onnxruntime_encoder  # noqa: E402
from clearformer import TextEncoder  # noqa: E402
from clearformer.interop.hf import bundled_model_dir  # noqa: E402

TEXTS = [
    "A short one.",
    "The committee postponed its decision until the budget figures were checked again.",
    "Yes",
    "Rain is expected over the northern hills tonight, with snow above a thousand metres.",
]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("onnx-rows")
    paths, fused = onnxruntime_encoder.build_models(bundled_model_dir(), workdir)
    return paths, fused


def test_the_optimiser_fuses_attention_and_layer_norms(built):
    _, fused = built
    assert fused.get("Attention") == 6  # one per layer of all-MiniLM-L6-v2
    assert fused.get("SkipLayerNormalization") == 12


def test_int8_rows_run_int8_products(built):
    import onnx

    paths, _ = built
    for name, path in paths.items():
        ops = {node.op_type for node in onnx.load(str(path)).graph.node}
        assert ("MatMulInteger" in ops) == ("int8" in name), (name, sorted(ops))
    int8_ops = {n.op_type for n in onnx.load(str(paths["onnxruntime int8"])).graph.node}
    assert "DynamicQuantizeLinear" in int8_ops  # activations quantised at run time


def test_onnx_rows_match_clearformer(built):
    paths, _ = built
    ours = TextEncoder.from_pretrained()
    expected = ours.encode(TEXTS, normalize=True, progress=False)
    for name, path in paths.items():
        encoder = onnxruntime_encoder.OnnxEncoder.load(path, ours.tokenizer, ours.dim, threads=1)
        encoder.batch_size = 3  # two batches of different lengths, rows scattered back in order
        got = encoder.encode(TEXTS)
        assert got.shape == expected.shape
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
        cosine = (got.astype(np.float64) * expected).sum(1)
        # int8: ONNX Runtime's own error (per tensor, 0.875 on "Yes"); a wrong model is far lower.
        floor = 0.99999 if "int8" not in name else 0.8
        assert cosine.min() >= floor, (name, cosine)


def test_replot_redraws_a_saved_result(tmp_path):
    saved = BENCHMARKS / "results" / "encode-throughput.json"
    report = __import__("json").loads(saved.read_text())
    encode_throughput.write_report(report, tmp_path / "again")
    markdown = (tmp_path / "again.md").read_text()
    assert "| onnxruntime |" in markdown and "nearest neighbour" in markdown
    pytest.importorskip("matplotlib")
    assert (tmp_path / "again.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_nearest_neighbours_leave_each_row_out():
    vectors = np.eye(3, dtype=np.float32)
    vectors[2] = np.array([0.8, 0.6, 0.0])  # closest to row 0; rows 0 and 1 closest to it
    assert encode_throughput._nearest_neighbours(vectors).tolist() == [2, 2, 0]


def test_paired_ratios_compare_each_repeat_and_skip_missing_rows():
    per_repeat = {
        "sentence-transformers": [2.0, 3.0],
        "clearformer": [1.0, 2.0],
        "clearformer int8 fused": [0.5, 1.0],
        "onnxruntime int8": [0.4, 1.5],
    }
    pairs = {
        (p["ours"], p["other"]): p["ratios"] for p in encode_throughput.paired_ratios(per_repeat)
    }
    assert pairs == {
        ("clearformer", "sentence-transformers"): [2.0, 1.5],
        ("clearformer int8 fused", "sentence-transformers"): [4.0, 3.0],
        ("clearformer int8 fused", "onnxruntime int8"): [0.8, 1.5],
    }


def test_each_repeat_is_held_against_the_faster_reading_beside_it():
    # 2e11 FLOPs: 1 s at 200 GFLOP/s. Repeat 0 sits between 200 and 100 (held at 200), repeat 1
    # between 100 and 250 (held at 250): a swing of the host's rate moves each repeat's bound.
    got = encode_throughput.fraction_per_repeat(2e11, [200.0, 100.0, 250.0], {"a": [2.0, 1.0]})
    assert got["a"] == pytest.approx([0.5, 0.8])
    with pytest.raises(ValueError, match="one reading more than repeats"):
        encode_throughput.fraction_per_repeat(2e11, [200.0, 100.0], {"a": [2.0, 1.0]})
