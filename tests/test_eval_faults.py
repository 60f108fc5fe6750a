"""``clearformer eval`` faults a review found: an index of other texts searched in silence, an
existing index's settings recorded as None, outputs that overwrite the inputs or are lost to
a closed stdout, flags checked late or not named, and compared figures that are no figures."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from .contrastive_helpers import write_retrieval_data, write_sentence_transformer
from .index_helpers import cli

pytest.importorskip("sentence_transformers")

_COUNTED = re.compile(r"queries, [0-9,]+ documents")  # printed once the data is read


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval-faults")
    model = write_sentence_transformer(root / "st")
    _, beir = write_retrieval_data(root / "data", rows=12)
    return model, beir


def _edited(beir: Path, target: Path) -> Path:
    """A copy of ``beir`` whose documents keep their ids but hold each other's texts."""
    shutil.copytree(beir, target)
    rows = [json.loads(line) for line in (target / "corpus.jsonl").read_text().splitlines()]
    texts = [row["text"] for row in rows]
    for row, text in zip(rows, texts[1:] + texts[:1], strict=True):
        row["text"] = text
    (target / "corpus.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return target


def _eval(model: Path, beir: Path, *flags: str):
    return cli("eval", "--data", str(beir), "--model", str(model), "--no-progress", *flags)


def test_an_index_of_the_same_ids_with_other_texts_is_refused(tiny, tmp_path):
    model, beir = tiny
    edited = _edited(beir, tmp_path / "edited")
    for flags in (
        ["--storage", "int8"],  # dense: _check_index_matches
        ["--mode", "hybrid", "--kinds", "dense"],  # the dense kind of a folder of kinds
        ["--mode", "bm25"],  # another kind: the folder's texts store
    ):
        index = tmp_path / f"idx-{flags[-1]}"
        built = _eval(model, beir, "--index", str(index), *flags)
        assert built.returncode == 0, built.stderr
        done = _eval(model, edited, "--index", str(index), *flags)
        assert done.returncode == 2, (flags, done.stdout)
        assert "built from other texts" in done.stderr and "--index" in done.stderr, done.stderr
        assert "ndcg@10" not in done.stdout
        assert "Traceback" not in done.stderr


def test_an_existing_index_records_the_storage_search_and_width_it_ran(tiny, tmp_path):
    model, beir = tiny
    index, out = tmp_path / "idx", tmp_path / "r.json"
    built = _eval(model, beir, "--index", str(index), "--storage", "int8", "--dimensions", "8")
    assert built.returncode == 0, built.stderr
    done = _eval(model, beir, "--index", str(index), "--out", str(out))  # the index's own
    assert done.returncode == 0, done.stderr
    settings = json.loads(out.read_text())["settings"]
    assert settings["storage"] == "int8" and settings["dimensions"] == 8
    assert settings["ann"] == "exact"  # auto, on 12 rows
    assert "8 dims" in done.stdout and "int8 storage, exact" in done.stdout
    # A full-width index records None, as the docs read it, whatever its storage.
    full = tmp_path / "full"
    assert _eval(model, beir, "--index", str(full), "--storage", "binary").returncode == 0
    done = _eval(model, beir, "--index", str(full), "--out", str(out))
    assert done.returncode == 0, done.stderr
    settings = json.loads(out.read_text())["settings"]
    assert settings["storage"] == "binary" and settings["dimensions"] is None


def test_an_output_onto_an_input_is_refused_before_any_work(tiny, tmp_path):
    model, beir = tiny
    data = tmp_path / "data"
    shutil.copytree(beir, data)
    compared = tmp_path / "base.json"
    assert _eval(model, data, "--out", str(compared)).returncode == 0
    os.link(data / "queries.jsonl", tmp_path / "linked.jsonl")
    refusals = [
        (["--run-out", str(data / "qrels" / "test.tsv")], "--run-out", "--data"),
        (["--out", str(data / "corpus.jsonl")], "--out", "--data"),
        (["--out", str(data / "sub" / ".." / "corpus.jsonl")], "--out", "--data"),
        (["--out", str(tmp_path / "linked.jsonl")], "--out", "--data"),  # a hard link
        (["--split", "dev", "--run-out", str(data / "qrels" / "dev.tsv")], "--run-out", "--split"),
        (["--compare", str(compared), "--out", str(compared)], "--out", "--compare"),
        (["--compare", str(compared), "--run-out", str(compared)], "--run-out", "--compare"),
    ]
    (data / "sub").mkdir()
    before = {p: p.read_bytes() for p in [*data.rglob("*.*"), compared] if p.is_file()}
    for flags, output, source in refusals:
        done = _eval(model, data, *flags)
        assert done.returncode == 2, (flags, done.stdout)
        assert output in done.stderr and source in done.stderr, done.stderr
        assert not _COUNTED.search(done.stderr) and "Traceback" not in done.stderr
    assert {p: p.read_bytes() for p in before} == before


class _GoneReader(io.StringIO):
    """stdout whose reader has gone (`eval ... | head`): every write breaks the pipe."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


def test_the_outputs_are_written_before_the_table_is_printed(tiny, tmp_path):
    from clearformer.cli import main

    model, beir = tiny
    out, run = tmp_path / "r.json", tmp_path / "r.run"
    argv = ["eval", "--data", str(beir), "--model", str(model), "--no-progress"]
    with contextlib.redirect_stdout(_GoneReader()), contextlib.redirect_stderr(io.StringIO()):
        main([*argv, "--out", str(out), "--run-out", str(run)])
    assert json.loads(out.read_text())["metrics"]["ndcg@10"] >= 0
    assert run.read_text().count(" Q0 ") > 0


@pytest.fixture
def embedded(monkeypatch):
    """The texts each encode call was given."""
    from clearformer import TextEncoder

    calls: list[int] = []
    original = TextEncoder.encode

    def encode(self, texts, *args, **kwargs):
        calls.append(len(texts))
        return original(self, texts, *args, **kwargs)

    monkeypatch.setattr(TextEncoder, "encode", encode)
    return calls


def test_an_unknown_prompt_name_is_refused_before_any_text_is_embedded(tiny, embedded):
    model, beir = tiny
    for flag in ("--query-prompt-name", "--document-prompt-name"):
        done = _eval(model, beir, flag, "nosuch")
        assert done.returncode == 2, done.stdout
        assert f"{flag} 'nosuch'" in done.stderr and "Traceback" not in done.stderr
        assert embedded == [], flag


@pytest.fixture
def no_model(monkeypatch):
    """Loading the dense model fails the test: a refusal must come first."""
    from clearformer.commands import encode

    def load_encoder(args, **kwargs):
        raise AssertionError("the model was loaded before the refusal")

    monkeypatch.setattr(encode, "load_encoder", load_encoder)


def test_a_missing_model_is_named_by_its_flag(tiny, tmp_path):
    _, beir = tiny
    done = cli("eval", "--data", str(beir), "--model", str(tmp_path / "nonexistent"))
    assert done.returncode == 2 and "--model" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_a_file_as_index_is_refused_before_the_model_loads(tiny, tmp_path, no_model):
    model, beir = tiny
    afile = tmp_path / "afile"
    afile.write_text("not an index\n")
    done = _eval(model, beir, "--index", str(afile))
    assert done.returncode == 2 and f"--index {afile} is a file" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and afile.read_text() == "not an index\n"


def test_an_unknown_kind_is_refused_before_the_model_loads(tiny, no_model):
    model, beir = tiny
    done = _eval(model, beir, "--mode", "hybrid", "--kinds", "dense,foo")
    assert done.returncode == 2 and "--kinds: 'foo' is not a kind" in done.stderr, done.stderr
    assert "dense, sparse, multivector, bm25" in done.stderr and "Traceback" not in done.stderr


def test_a_qrels_file_that_is_a_directory_is_said_to_be_one(tiny, tmp_path, no_model):
    model, beir = tiny
    data = tmp_path / "data"
    shutil.copytree(beir, data)
    (data / "qrels" / "test.tsv").unlink()
    (data / "qrels" / "test.tsv").mkdir()
    done = _eval(model, data)
    assert done.returncode == 2, done.stdout
    assert f"{data / 'qrels' / 'test.tsv'}: is a directory" in done.stderr, done.stderr


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 5.0, -0.25])
def test_compared_figures_outside_zero_to_one_are_refused(tiny, tmp_path, bad):
    model, beir = tiny
    base = tmp_path / "base.json"
    assert _eval(model, beir, "--out", str(base)).returncode == 0
    result = json.loads(base.read_text())
    query = sorted(result["per_query"])[-1]
    result["per_query"][query]["mrr@10"] = bad
    other = tmp_path / "other.json"
    other.write_text(json.dumps(result))  # NaN and Infinity as Python's json writes them
    done = _eval(model, beir, "--compare", str(other))
    assert done.returncode == 2, done.stdout
    assert f"--compare {other}" in done.stderr and f"query {query!r}, mrr@10" in done.stderr
    assert not _COUNTED.search(done.stderr) and "Traceback" not in done.stderr
