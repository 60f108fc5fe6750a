"""``clearformer index build --kind`` and ``clearformer search --index --mode``: several kinds
over one corpus through the command line, the same results as the Python API, and every
refusal a one-line error that names the kinds present and changes nothing."""

from __future__ import annotations

import json

import pytest

from clearformer.index import HybridIndex

from .hybrid_helpers import FakeSparseEncoder
from .index_helpers import cli, tiny_model, word_texts

pytest.importorskip("usearch")
pytest.importorskip("bm25s")

QUERY = "w3 w7 w11"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli-kinds")
    model = tiny_model(root / "model")
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(word_texts(120)) + "\n", encoding="utf-8")
    out = root / "idx"
    for kind, extra in (("bm25", ()), ("dense", ("--model", str(model)))):
        result = cli("index", "build", "--kind", kind, "--corpus", str(corpus), "--out", str(out),
                     "--no-progress", *extra)  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert f"built the {kind} index of {out}" in result.stderr
    return {"model": model, "corpus": corpus, "out": out, "root": root}


def search(setup, *flags: str):
    result = cli("search", QUERY, "--index", str(setup["out"]), "--json", "-k", "5", *flags)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def snapshot(folder):
    return sorted((str(p), p.stat().st_size) for p in folder.rglob("*") if p.is_file())


def test_folder_holds_one_texts_store_and_a_sub_index_per_kind(setup):
    names = sorted(p.name for p in setup["out"].iterdir() if not p.name.startswith("."))
    assert names == ["bm25", "dense", "texts"]


@pytest.mark.parametrize("mode", ["dense", "bm25", "hybrid"])
def test_cli_search_gives_the_python_api_results(setup, mode):
    from clearformer import TextEncoder

    index = HybridIndex.open(setup["out"], [TextEncoder.from_pretrained(setup["model"])])
    expected = index.search(QUERY, k=5, mode=mode)
    model = () if mode == "bm25" else ("--model", str(setup["model"]))  # bm25 refuses one
    found = search(setup, "--mode", mode, *model)
    assert [(h["id"], h["text"]) for h in found] == [(h.id, h.text) for h in expected]
    assert [h["score"] for h in found] == pytest.approx([h.score for h in expected], abs=1e-6)


def test_cli_weighted_fusion_with_zero_weight_is_the_other_kind(setup):
    model = ("--model", str(setup["model"]))
    bm25 = search(setup, "--mode", "bm25")
    weighted = search(
        setup, "--mode", "hybrid", "--fusion", "weighted", "--weights", "dense=0,bm25=1",
        "--normalization", "zscore", *model,
    )  # fmt: skip
    assert [h["id"] for h in weighted] == [h["id"] for h in bm25]
    rrf = search(setup, "--mode", "hybrid", *model)  # the default fusion
    assert rrf[0]["score"] <= 2 / 61 + 1e-6


def test_cli_sparse_build_and_search_with_a_sparse_model(setup, monkeypatch, tmp_path):
    """The sparse encoder loads through commands.kind_models.load_model (faked here)."""
    import clearformer.commands.kind_models as kinds

    monkeypatch.setattr(kinds, "load_model", lambda kind, path, **o: FakeSparseEncoder())
    monkeypatch.setattr(kinds, "checkpoint_kind", lambda path: "sparse")
    out = tmp_path / "idx"
    flags = ("--corpus", str(setup["corpus"]), "--out", str(out), "--no-progress")
    result = cli("index", "build", "--kind", "sparse", "--model", str(tmp_path), *flags)
    assert result.returncode == 0, result.stderr
    result = cli("search", QUERY, "--index", str(out), "--json", "--sparse-model", str(tmp_path))
    assert result.returncode == 0, result.stderr
    found = [json.loads(line) for line in result.stdout.splitlines()]
    index = HybridIndex.open(out, [FakeSparseEncoder()])
    assert [h["id"] for h in found] == [h.id for h in index.search(QUERY, k=5, mode="sparse")]
    # a sparse model given to a dense build: refused naming both kinds, nothing written
    result = cli("index", "build", "--kind", "dense", "--model", str(tmp_path), *flags[:4])
    assert result.returncode == 2
    assert "is a sparse model; a dense index needs a dense model" in result.stderr
    assert not (out / "dense").exists()


def refused(setup, *argv: str) -> str:
    before = snapshot(setup["out"])
    result = cli(*argv)
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stdout == ""
    assert snapshot(setup["out"]) == before  # nothing changed
    return lines[0]


def test_refusals_name_the_kinds_present(setup, tmp_path):
    out, corpus = str(setup["out"]), str(setup["corpus"])
    line = refused(setup, "search", QUERY, "--index", out, "--mode", "sparse")
    assert "holds no sparse index (it holds dense, bm25)" in line
    line = refused(setup, "search", QUERY, "--index", out, "--mode", "hybrid",
                   "--kinds", "dense,multivector")  # fmt: skip
    assert "holds no multivector index (it holds dense, bm25)" in line
    line = refused(setup, "search", QUERY, "--index", out, "--candidates", "50")
    assert "--candidates applies to multivector or sparse, not dense, bm25" in line
    line = refused(setup, "search", QUERY, "--index", out, "--weights", "dense=1")
    assert "apply to --fusion weighted" in line
    line = refused(setup, "search", QUERY, "--index", out, "--fusion", "weighted",
                   "--weights", "sparse=1")  # fmt: skip
    assert "'sparse' is not a fused kind" in line
    other = tmp_path / "other.txt"
    other.write_text("w1 w2\nw3\n", encoding="utf-8")
    line = refused(setup, "index", "build", "--kind", "bm25", "--corpus", str(other), "--out", out)
    assert "holds an index of other texts" in line and "kinds dense, bm25" in line
    line = refused(setup, "index", "build", "--kind", "bm25", "--corpus", corpus, "--out", out,
                   "--model", str(setup["model"]))  # fmt: skip
    assert "a bm25 index uses no model" in line
    line = refused(setup, "index", "build", "--kind", "sparse", "--corpus", corpus, "--out", out)
    assert "a sparse index needs a sparse model" in line
    line = refused(setup, "index", "build", "--kind", "bm25", "--corpus", corpus, "--out", out,
                   "--storage", "int8")  # fmt: skip
    assert "--storage applies to --kind dense" in line
    line = refused(setup, "index", "build", "--kind", "bm25", "--corpus", corpus, "--out", out,
                   "--engine", "seismic")  # fmt: skip
    assert "--engine applies to --kind sparse" in line
    with pytest.raises(SystemExit) as exit_:  # argparse's own refusal of an unknown kind
        cli("index", "build", "--kind", "splade", "--corpus", corpus, "--out", out)
    assert exit_.value.code == 2


def test_a_plain_dense_index_keeps_its_behaviour_and_names_its_kind(setup, tmp_path):
    plain = tmp_path / "plain"
    build = cli("index", "build", "--corpus", str(setup["corpus"]), "--out", str(plain),
                "--model", str(setup["model"]), "--no-progress")  # fmt: skip
    assert build.returncode == 0, build.stderr
    assert (plain / "CURRENT").is_file() and not (plain / "texts").exists()
    default = cli("search", QUERY, "--index", str(plain), "--json")
    dense = cli("search", QUERY, "--index", str(plain), "--json", "--mode", "dense")
    assert default.returncode == 0 and default.stdout == dense.stdout
    result = cli("search", QUERY, "--index", str(plain), "--mode", "bm25")
    assert result.returncode == 2
    assert "holds no bm25 index (it holds dense)" in result.stderr
    result = cli("index", "build", "--kind", "bm25", "--corpus", str(setup["corpus"]),
                 "--out", str(plain))  # fmt: skip
    assert result.returncode == 2 and "dense index built without --kind" in result.stderr


def test_index_info_lists_the_kinds(setup):
    result = cli("index", "info", str(setup["out"]))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "120 texts, kinds dense, bm25" in lines[0]
    assert lines[1].startswith("dense ") and lines[2].startswith("bm25 ") and "no model" in lines[2]


def test_a_build_without_kind_on_a_folder_of_kinds_adds_its_dense_kind(setup, tmp_path):
    out = tmp_path / "kinds"
    first = cli("index", "build", "--kind", "bm25", "--corpus", str(setup["corpus"]),
                "--out", str(out), "--no-progress")  # fmt: skip
    assert first.returncode == 0, first.stderr
    result = cli("index", "build", "--corpus", str(setup["corpus"]), "--out", str(out),
                 "--model", str(setup["model"]), "--no-progress")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"built the dense index of {out}" in result.stderr
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [
        "bm25",
        "dense",
        "texts",
    ]


def test_flags_that_do_not_apply_are_refused_and_a_large_k_is_the_whole_index(setup, tmp_path):
    out, corpus = str(setup["out"]), str(setup["corpus"])
    for flags, said in (
        (("--corpus", corpus, "--rrf-k", "-9"), "--rrf-k applies to --index, not a --corpus"),
        (("--corpus", corpus, "--depth", "5"), "--depth applies to --index, not a --corpus"),
        (("--corpus", corpus, "--weights", "x"), "--weights applies to --index"),
        (("--index", out, "--mode", "bm25", "--rrf-k", "-5"), "--rrf-k applies to --mode hybrid"),
        (("--index", out, "--mode", "bm25", "--depth", "5"), "--depth applies to --mode hybrid"),
    ):
        line = refused(setup, "search", QUERY, *flags)
        assert said in line, line
    # -k far above the rows: every row once, not an allocation of -k rows.
    for mode in ("bm25", "hybrid", "dense"):
        result = cli("search", QUERY, "--index", out, "--mode", mode, "-k", "100000000000",
                     "--json")  # fmt: skip
        assert result.returncode == 0, result.stderr
        ids = [json.loads(line)["id"] for line in result.stdout.splitlines()]
        assert len(ids) == len(set(ids)) <= 120 and len(ids) > 0


def test_jsonl_corpus_results_name_their_file_line(setup, tmp_path):
    corpus = tmp_path / "blank-lines.jsonl"
    corpus.write_text('{"text": "w1 w2"}\n\n{"text": ""}\n{"text": "w3 w4"}\n', encoding="utf-8")
    result = cli("search", "w3", "--corpus", str(corpus), "--model", str(setup["model"]),
                 "--json")  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = {json.loads(x)["text"]: json.loads(x)["line"] for x in result.stdout.splitlines()}
    assert lines == {"w1 w2": 1, "w3 w4": 4}


def test_a_missing_optional_package_is_one_error_line(setup, monkeypatch):
    from clearformer.cli import main
    from clearformer.commands import search_kinds

    def missing(*args, **kwargs):
        raise ModuleNotFoundError("No module named 'bm25s'", name="bm25s")

    monkeypatch.setattr(search_kinds, "run_kind_search", missing)
    import io
    from contextlib import redirect_stderr

    err = io.StringIO()
    with redirect_stderr(err):
        code = main(["search", QUERY, "--index", str(setup["out"]), "--mode", "bm25"])
    assert code == 2
    assert err.getvalue().strip() == (
        "clearformer search: error: No module named 'bm25s' (pip install bm25s)"
    )


def test_an_index_path_that_is_a_file_is_named_so(setup):
    line = refused(setup, "search", QUERY, "--index", str(setup["corpus"]), "--mode", "bm25")
    assert line.endswith("is a file, not an index folder (`clearformer index build`)")
    line = refused(setup, "search", QUERY, "--index", str(setup["corpus"]))
    assert "is a file, not an index folder" in line


def test_a_query_that_matches_nothing_says_so_on_stderr(setup):
    result = cli("search", "the of and", "--index", str(setup["out"]), "--mode", "bm25")
    assert result.returncode == 0 and result.stdout == ""
    assert result.stderr.strip() == (
        "clearformer search: no text matches the query (BM25 finds texts sharing a word with "
        "it, stop words aside)"
    )
