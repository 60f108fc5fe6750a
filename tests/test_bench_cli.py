"""``clearformer bench``: option errors are one line with exit status 2; a tiny run works."""

from __future__ import annotations

import json

import pytest

from clearformer.bench.flops import forward_flops
from clearformer.bench.workloads import SIZES, ragged_batch
from clearformer.cli import main


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--sizes", "huge"], "size must be one of"),
        (["--batch", "0"], "batch must be a positive int, got 0"),
        (["--train-batch", "-3"], "train_batch must be a positive int, got -3"),
        (["--max-length", "1024"], "max_length must be at most the models' maximum length 512"),
        (["--seqlen", "600"], "seqlen must be at most the models' maximum length 512"),
        (["--min-length", "300", "--max-length", "200"], "min_length must be <= max_length"),
        (["--long-seqlens", "512,0"], "long_seqlens must be positive ints"),
        (["--sections", "inference,speed"], "sections must be among"),
        (["--sections", ","], "sections must name at least one of"),
        (["--sections", "long", "--long-seqlens", ","], "long_seqlens must name at least one"),
        (["--quick", "--repeats", "0"], "repeats must be a positive int"),
    ],
)
def test_bad_options_give_one_line_and_exit_2(argv, expected, capsys):
    assert main(["bench", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("clearformer bench: error: ") and expected in err, err


def test_tiny_run_writes_markdown_and_json(tmp_path, capsys):
    argv = ["bench", "--sizes", "minilm", "--sections", "kernels", "--batch", "3",
            "--repeats", "1", "--warmup", "0", "--no-chart", "--out", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "GEMM rate" in out and "varlen sequence" in out
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["environment"]["allocator"] and data["gemm_gflops"]["minilm"] > 0
    assert {row["impl"] for row in data["rows"]} >= {"varlen sequence", "padded SDPA (masked)"}
    assert (tmp_path / "bench.md").read_text().startswith("# clearformer benchmark")
    # Every result says how busy the machine was, and times CPU work beside wall time.
    assert set(data["load"]) >= {"before", "after", "loaded", "reason"}
    assert "Machine: " in out and all(row["cpu_ms"] > 0 for row in data["rows"])
    assert len(data["gemm_first_last"]["minilm"]) == 2


def test_model_flops_count_real_tokens_only():
    size = SIZES["minilm"]
    batch = ragged_batch(size, 4, 16, 256, seed=1)
    assert batch.mask.shape == (4, 256) and batch.mask.sum() == batch.real_tokens
    one = forward_flops(size, [100])
    assert forward_flops(size, [100, 0]) == one
    assert forward_flops(size, [100, 100]) == 2 * one
