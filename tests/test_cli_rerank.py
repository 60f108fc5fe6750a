"""``clearformer rerank`` as a real subprocess, on small random cross-encoders: the order and
scores are sentence-transformers', errors are one line with exit status 2, and the
destination is checked before any work."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from .faults.conftest import cli_env, run_cli
from .test_sequence_classification import make_classifier

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("transformers")

LINES = ["w1 w2 w3", "", "w4 w5 w6 w7", "w9", "   ", "w1 w2 w10 w11", "w20 w21 w22 w23 w24"]
QUERY = "w1 w2"


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    path = tmp_path_factory.mktemp("reranker")
    make_classifier("bert", path, num_labels=1)
    return path


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    return path


def _one_line_error(done, fragment):
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.startswith("clearformer rerank: error: "), done.stderr
    assert fragment in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert done.stdout == ""


def test_ranks_lines_by_the_cross_encoders_score(reranker, corpus):
    st = pytest.importorskip("sentence_transformers")
    done = run_cli(
        "rerank", QUERY, "--corpus", str(corpus), "--model", str(reranker), "-k", "3", "--json"
    )
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    texts = [t for t in LINES if t.strip()]
    scores = st.CrossEncoder(str(reranker), device="cpu").predict([(QUERY, t) for t in texts])
    best = np.argsort(-scores, kind="stable")[:3]
    assert [r["text"] for r in rows] == [texts[i] for i in best]
    assert [r["rank"] for r in rows] == [1, 2, 3]
    np.testing.assert_allclose([r["score"] for r in rows], scores[best], atol=2e-6, rtol=0)
    assert [r["line"] for r in rows] == [LINES.index(texts[i]) + 1 for i in best]  # blanks count
    one = run_cli(
        "rerank",
        QUERY,
        "--corpus",
        str(corpus),
        "--model",
        str(reranker),
        "-k",
        "3",
        "--json",
        "--workers",
        "1",
    )  # one batch at a time: the same ranking, the same scores to float32 rounding
    assert one.returncode == 0, one.stderr
    alone = [json.loads(line) for line in one.stdout.splitlines()]
    assert [r["line"] for r in alone] == [r["line"] for r in rows]
    np.testing.assert_allclose([r["score"] for r in alone], [r["score"] for r in rows], atol=1e-6)

    plain = run_cli("rerank", QUERY, "--corpus", str(corpus), "--model", str(reranker), "-k", "1")
    assert plain.returncode == 0, plain.stderr
    first = rows[0]
    assert plain.stdout == f"  1  {first['score']:.4f}  line {first['line']}: {first['text']}\n"


def test_output_file_is_written_and_checked_before_the_work(reranker, corpus, tmp_path):
    target = tmp_path / "ranked.jsonl"
    done = run_cli(
        "rerank", QUERY, "--corpus", str(corpus), "--model", str(reranker), "-o", str(target)
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and "wrote 5 results" in done.stderr
    assert len(target.read_text().splitlines()) == 5
    missing = tmp_path / "no" / "such" / "dir" / "out.jsonl"
    # A bad destination fails before the model loads: the model path need not even exist.
    done = run_cli(
        "rerank", QUERY, "--corpus", str(corpus), "--model", "nowhere", "-o", str(missing)
    )
    _one_line_error(done, "does not exist")
    _one_line_error(
        run_cli("rerank", QUERY, "--corpus", str(corpus), "--model", "x", "-o", "out.txt"),
        "--output must end in .jsonl",
    )


def test_bad_inputs_are_one_line_errors(reranker, corpus, tmp_path):
    from .test_pretrained_checkpoints import make_checkpoint

    embedder = tmp_path / "embedder"
    embedder.mkdir()
    make_checkpoint("bert", embedder)
    three = tmp_path / "three"
    three.mkdir()
    make_classifier("bert", three, num_labels=3)
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n")
    cases = [
        (["--corpus", str(tmp_path / "none.txt"), "--model", str(reranker)], "not found"),
        (["--corpus", str(blank), "--model", str(reranker)], "no non-blank texts"),
        (["--corpus", str(corpus), "--model", str(tmp_path / "nodir")], "not found"),
        (["--corpus", str(corpus), "--model", str(embedder)], "no sequence-classification head"),
        (["--corpus", str(corpus), "--model", str(three)], "num_labels=3"),
    ]
    for extra, fragment in cases:
        _one_line_error(run_cli("rerank", QUERY, *extra), fragment)
    _one_line_error(
        run_cli("rerank", " ", "--corpus", str(corpus), "--model", str(reranker)), "QUERY is empty"
    )
    workers = run_cli(
        "rerank", QUERY, "--corpus", str(corpus), "--model", str(reranker), "--workers", "0"
    )  # refused by the parser, before the model loads
    assert workers.returncode == 2 and "argument --workers" in workers.stderr, workers.stderr


def test_without_a_model_says_how_to_get_a_cross_encoder(corpus):
    # No cross-encoder is bundled: one line that says what to give and where to get it,
    # not the parser's usage.
    done = run_cli("rerank", QUERY, "--corpus", str(corpus))
    _one_line_error(done, "--model DIR is required: no cross-encoder is bundled")
    assert "sentence-transformers CrossEncoder" in done.stderr
    assert "*ForSequenceClassification" in done.stderr and "save_pretrained" in done.stderr


def test_help_lists_rerank_and_parsing_imports_nothing_heavy():
    assert "rerank" in run_cli("--help").stdout
    probe = (
        "import sys\nfrom clearformer.cli import build_parser\n"
        "build_parser().parse_args(['rerank', 'q', '--corpus', 'f', '--model', 'd'])\n"
        "print(sorted(m for m in ('torch', 'numpy', 'tokenizers') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], env=cli_env(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr


def test_closed_stdout_is_refused_before_the_work_unless_writing_a_file(reranker, corpus, tmp_path):
    def close_stdout():
        os.close(1)

    argv = ["rerank", QUERY, "--corpus", str(corpus), "--model", str(reranker)]
    done = run_cli(*argv, stdout=None, preexec_fn=close_stdout)
    assert done.returncode == 2 and "stdout is closed" in done.stderr
    assert "--output FILE.jsonl" in done.stderr
    target = tmp_path / "out.jsonl"
    done = run_cli(*argv, "-o", str(target), stdout=None, preexec_fn=close_stdout)
    assert done.returncode == 0, done.stderr
    assert len(target.read_text().splitlines()) == 5
