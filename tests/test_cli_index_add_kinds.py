"""``clearformer index add INDEX --corpus FILE`` on a folder of kinds: what it adds and holds,
per kind; an add of texts all held says "0 added" and exits 0; every refusal (a model of
another kind or identity, a kind left without its model, an empty corpus) is one line, exit
status 2, and changes nothing in the folder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from clearformer import TextEncoder

from .add_kinds_helpers import IDS, TEXTS, A, B, assert_same_results, build_all, results, snapshot
from .helpers import write_tiny_bert
from .hybrid_helpers import FakeMultiVectorEncoder, FakeSparseEncoder
from .index_helpers import WORDS, cli, tiny_model

pytest.importorskip("usearch")
pytest.importorskip("bm25s")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli-add-kinds")
    dense = TextEncoder.from_pretrained(tiny_model(root / "model"))
    build_all(root / "a", TEXTS[:A], IDS[:A], dense)
    build_all(root / "whole", TEXTS[:B], IDS[:B], dense)
    corpus = root / "more.jsonl"
    corpus.write_text(
        "".join(json.dumps({"key": i, "body": t}) + "\n" for i, t in zip(IDS, TEXTS, strict=True)),
        encoding="utf-8",
    )  # every text; --id-field key keeps the ids the folders were built with
    for name in ("splade-0", "splade-3", "colbert-0"):
        (root / name).mkdir()
    (root / "empty.txt").write_text("\n \n", encoding="utf-8")
    return {"root": root, "dense": dense, "corpus": corpus}


@pytest.fixture(autouse=True)
def fake_kind_models(monkeypatch):
    """A directory named splade-N or colbert-N loads as a fake sparse or multi-vector model of
    seed N (the kinds' models load through commands.kind_models)."""
    import clearformer.commands.kind_models as kinds

    real = kinds.checkpoint_kind

    def kind_of(path):
        name = Path(path).name
        return {"splade": "sparse", "colbert": "multivector"}.get(name.split("-")[0]) or real(path)

    def load(kind, path, **options):
        name, seed = Path(path).name.split("-")
        model = FakeSparseEncoder if name == "splade" else FakeMultiVectorEncoder
        return model(seed=int(seed))

    monkeypatch.setattr(kinds, "checkpoint_kind", kind_of)
    monkeypatch.setattr(kinds, "load_model", load)


def add(setup, out, *flags, corpus=None):
    corpus = corpus or setup["corpus"]
    return cli("index", "add", str(out), "--corpus", str(corpus), "--field", "body",
               "--id-field", "key", "--no-progress", *flags)  # fmt: skip


def models(setup, sparse="splade-0", multivector="colbert-0"):
    root = setup["root"]
    return (
        "--sparse-model", str(root / sparse), "--multivector-model", str(root / multivector)
    )  # fmt: skip


def test_cli_add_reports_per_kind_and_matches_a_build_of_all(setup, tmp_path):
    out = tmp_path / "idx"
    shutil.copytree(setup["root"] / "a", out)
    part = tmp_path / "part.jsonl"
    part.write_text("".join(setup["corpus"].read_text().splitlines(True)[:B]), encoding="utf-8")
    result = add(setup, out, *models(setup), corpus=part)  # A again, and B
    assert result.returncode == 0, result.stderr
    lines = result.stderr.strip().splitlines()
    assert f"added {B - A} texts to {out} ({A} already held): it holds {B} texts" in lines[-5]
    for line, kind in zip(lines[-4:], ("dense", "sparse", "multivector", "bm25"), strict=True):
        assert line.split() == [kind, "added", str(B - A), "texts:", "it", "holds", str(B)]
    assert_same_results(
        results(out, setup["dense"]), results(setup["root"] / "whole", setup["dense"])
    )
    before = snapshot(out)
    again = add(setup, out, *models(setup), corpus=part)
    assert again.returncode == 0, again.stderr
    assert again.stderr.strip().splitlines()[-1] == (
        f"{out} already holds these {B} texts: 0 added; it holds {B} texts"
    )
    assert snapshot(out) == before
    info = cli("index", "info", str(out))
    assert f"{B} texts, kinds dense, sparse, multivector, bm25" in info.stdout
    assert all(f"{B} rows" in line for line in info.stdout.splitlines()[1:])


def refused(setup, out, *flags, corpus=None) -> str:
    before = snapshot(out)
    result = add(setup, out, *flags, corpus=corpus)
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert snapshot(out) == before  # nothing changed
    return lines[0]


def test_cli_refusals_are_one_line_and_change_nothing(setup, tmp_path):
    out = tmp_path / "idx"
    shutil.copytree(setup["root"] / "a", out)
    root = setup["root"]
    line = refused(setup, out, *models(setup, sparse="colbert-0"))
    assert f"--sparse-model {root / 'colbert-0'} is a multivector model; a sparse index needs a " \
           "sparse model" in line  # fmt: skip
    line = refused(setup, out, *models(setup, sparse="splade-3"))
    assert f"the sparse index of {out} was built with fake-splade (revision sparse-0" in line
    assert "the sparse model given is fake-splade (revision sparse-3" in line
    assert "differs in revision" in line
    line = refused(setup, out, "--multivector-model", str(root / "colbert-0"))
    assert "--sparse-model: the sparse index's model (not recorded) is not there" in line
    line = refused(setup, out, "--model", str(root / "splade-0"), *models(setup))
    assert "is a sparse model; a dense index needs a dense model" in line
    other = write_tiny_bert(root / "other-dense", WORDS, n_layers=2)
    line = refused(setup, out, "--model", str(other), *models(setup))
    assert f"the dense index of {out} was built with" in line and "differs in revision" in line
    line = refused(setup, out, *models(setup), corpus=root / "empty.txt")
    assert "holds no non-blank texts" in line
    bm25 = tmp_path / "bm25"
    shutil.copytree(setup["root"] / "a" / "bm25", bm25 / "bm25")
    shutil.copytree(setup["root"] / "a" / "texts", bm25 / "texts")
    line = refused(setup, bm25, "--sparse-model", str(root / "splade-0"))
    assert f"--sparse-model: {bm25} holds no sparse index (it holds bm25)" in line


def test_cli_add_to_a_plain_dense_index_refuses_the_kinds_flags(setup, tmp_path):
    plain = tmp_path / "plain"
    text = tmp_path / "corpus.txt"
    text.write_text("\n".join(TEXTS[:20]) + "\n", encoding="utf-8")
    model = str(setup["dense"].path)
    built = cli("index", "build", "--corpus", str(text), "--out", str(plain), "--model", model,
                "--no-progress")  # fmt: skip
    assert built.returncode == 0, built.stderr
    result = cli("index", "add", str(plain), "--corpus", str(text), "--sparse-model", model)
    assert result.returncode == 2
    assert "--sparse-model applies to an index folder of kinds, not a dense index" in result.stderr
    result = cli("index", "add", str(plain), "--corpus", str(text), "--no-progress")
    assert result.returncode == 0 and "already holds these texts" in result.stderr


def test_a_kind_built_without_corpus_is_built_over_the_texts_the_folder_holds(setup, tmp_path):
    """After an add no single corpus file holds a folder's texts: a kind built without
    --corpus is built over the texts it holds, equal to that kind of a build of all."""
    out = tmp_path / "idx"
    shutil.copytree(setup["root"] / "a", out)
    part = tmp_path / "part.jsonl"
    part.write_text("".join(setup["corpus"].read_text().splitlines(True)[:B]), encoding="utf-8")
    assert add(setup, out, *models(setup), corpus=part).returncode == 0
    shutil.rmtree(out / "bm25")  # the kind to build again, over the texts held
    built = cli("index", "build", "--kind", "bm25", "--out", str(out), "--no-progress")
    assert built.returncode == 0, built.stderr
    assert f"{B} texts" in built.stderr
    ours, whole = results(out, setup["dense"]), results(setup["root"] / "whole", setup["dense"])
    assert_same_results(ours, whole)
    # Refused in one line where nothing is held, or with a corpus flag and no corpus.
    empty = cli("index", "build", "--kind", "bm25", "--out", str(tmp_path / "new"))
    assert empty.returncode == 2
    assert "--corpus FILE is required" in empty.stderr and "holds no texts yet" in empty.stderr
    assert not (tmp_path / "new").exists()
    flagged = cli("index", "build", "--kind", "bm25", "--out", str(out), "--field", "body")
    assert flagged.returncode == 2 and "--field applies with --corpus FILE" in flagged.stderr
    plain = cli("index", "build", "--out", str(tmp_path / "plain"), "--model", "x")
    assert plain.returncode == 2 and "--corpus FILE is required" in plain.stderr
