"""``benchmarks/families_speed.py`` builds what it says it times: directories at the real
Qwen3-Embedding-0.6B and EmbeddingGemma-300m shapes (a few layers of them here), which both
libraries load and agree on; its options refuse bad values with one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("sentence_transformers")

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import families_speed  # noqa: E402
from clearformer import TextEncoder  # noqa: E402

from .family_helpers import TEXTS, st_encode  # noqa: E402


def test_qwen3_directory_has_the_real_shape(tmp_path):
    out = families_speed.write_model("qwen3", tmp_path / "qwen3", layers=1)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "qwen3" and config["num_hidden_layers"] == 1
    assert (config["hidden_size"], config["intermediate_size"], config["head_dim"]) == (
        1024,
        3072,
        128,
    )
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (16, 8)
    assert config["rope_parameters"]["rope_theta"] == 1_000_000.0
    prompts = json.loads((out / "config_sentence_transformers.json").read_text())["prompts"]
    assert prompts["query"].startswith("Instruct: ")
    ours = TextEncoder.from_pretrained(out)
    assert ours.tokenizer.padding_side == "left" and ours.dim == 1024
    np.testing.assert_allclose(ours.encode(TEXTS[:3]), st_encode(out, TEXTS[:3]), atol=1e-5)


def test_gemma_directory_has_the_real_shape_and_layer_pattern(tmp_path):
    out = families_speed.write_model("gemma", tmp_path / "gemma", layers=7)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "gemma3_text" and config["use_bidirectional_attention"]
    assert config["sliding_window"] == 512  # transformers halves it in memory, saves 512 back
    assert config["layer_types"] == ["sliding_attention"] * 5 + ["full_attention"] + [
        "sliding_attention"
    ]
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (3, 1)
    assert (config["hidden_size"], config["intermediate_size"], config["head_dim"]) == (
        768,
        1152,
        256,
    )
    ours = TextEncoder.from_pretrained(out)
    assert [s.out_features for s in ours.head.config.steps] == [3072, 768] and ours.normalize
    np.testing.assert_allclose(
        ours.encode(TEXTS[:3], prompt_name="query"),
        st_encode(out, TEXTS[:3], prompt_name="query"),
        atol=1e-5,
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--models", "qwen3,bert"], "--models"),
        (["--texts", "0"], "--texts"),
        (["--layers", "-1"], "--layers"),
        (["--precision", "int4"], "--precision"),
    ],
)
def test_bad_options_are_one_line_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        families_speed.parse_args(argv)
    assert exit_info.value.code != 0
    assert message in capsys.readouterr().err.splitlines()[-1]


def test_cosines_see_a_flipped_row():
    a = np.eye(3, dtype=np.float32)
    b = a.copy()
    assert families_speed.cosines(a, b) == {"min": 1.0, "mean": 1.0}
    b[1] *= -1
    assert families_speed.cosines(a, b)["min"] == pytest.approx(-1.0)
