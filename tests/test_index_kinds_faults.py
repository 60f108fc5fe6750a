"""Faults of a folder of kinds found by review, each held to docs/hybrid.md:

1. a repair build given the first corpus after an add is refused (the store is never rolled
   back to an earlier state), changing nothing;
2. a kind whose ``CURRENT`` is removed or emptied, while its generations remain, is reported
   damaged, not left out of a hybrid search in silence;
4. a bge-m3 model serves a dense kind through its dense view, from Python and the CLI;
5. a kind's ``meta.json`` with a lost, unknown or mistyped field is one IndexDamagedError
   naming it (and a file where a kind's folder should be, naming that);
6. a bm25 build over texts of no word BM25 indexes is refused before anything is written.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from clearformer.index import (
    HybridIndex,
    IndexDamagedError,
    MultiVectorOptions,
    SparseOptions,
    add_to_kinds,
    build_index,
    layout,
    open_kind_index,
)
from clearformer.index.collection import kinds_present

from .hybrid_helpers import FakeMultiVectorEncoder, FakeSparseEncoder, word_corpus
from .index_helpers import cli

pytest.importorskip("bm25s")

TEXTS = word_corpus(30, seed=21)
IDS = [f"doc-{i}" for i in range(len(TEXTS))]
MORE = word_corpus(40, seed=22)[30:]
MORE_IDS = [f"doc-{i}" for i in range(30, 40)]
GENERATION = "generations/gen-000001"


def snapshot(folder):
    return sorted((str(p), p.read_bytes()) for p in folder.rglob("*") if p.is_file())


def one_error_line(result) -> str:
    """The one line a refused command prints (no traceback), its exit status 2."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def write_lines(path, texts):
    path.write_text("\n".join(texts) + "\n", encoding="utf-8")
    return path


# 1. ------------------------------------------------------------------------------------------


def test_after_an_add_the_first_corpus_cannot_roll_a_lost_record_back_cli(tmp_path):
    """The CLI's ids are FILE:LINE, so the first corpus's rows are exactly the store's first
    database: that database must not be named again (the added rows would be lost)."""
    first = write_lines(tmp_path / "corpus.txt", TEXTS)
    more = write_lines(tmp_path / "more.txt", MORE)
    out = tmp_path / "idx"
    build = ("index", "build", "--kind", "bm25", "--out", str(out), "--no-progress")
    assert cli(*build, "--corpus", str(first)).returncode == 0
    assert cli("index", "add", str(out), "--corpus", str(more), "--no-progress").returncode == 0
    record = out / "texts" / "texts.json"
    whole = json.loads(record.read_text())
    record.unlink()
    before = snapshot(out)
    line = one_error_line(cli(*build, "--corpus", str(first)))
    assert str(record) in line and "build without --corpus" in line
    assert f"holds these {len(TEXTS)} rows and {len(MORE)} added after them" in line
    assert snapshot(out) == before  # the add's database, which holds every row, is kept
    assert cli(*build).returncode == 0  # without --corpus: over the newest database
    assert json.loads(record.read_text())["content"] == whole["content"]
    found = cli("search", "w1 w2", "--index", str(out), "--mode", "bm25", "-k", "40", "--json")
    assert found.returncode == 0, found.stderr
    assert len(found.stdout.splitlines()) > 0
    assert open_kind_index(out, "bm25").rows == len(TEXTS) + len(MORE)


def test_after_an_add_the_first_texts_cannot_roll_a_lost_record_back_python(tmp_path):
    out = tmp_path / "idx"
    build_index(out, TEXTS, FakeSparseEncoder(), kind="sparse", ids=IDS,
                options=SparseOptions(chunk_rows=16))  # fmt: skip
    add_to_kinds(out, MORE, [FakeSparseEncoder()], ids=MORE_IDS)
    (out / "texts" / "texts.json").write_text("{}")
    before = snapshot(out)
    with pytest.raises(ValueError, match="added after them: build without --corpus"):
        build_index(out, TEXTS, kind="bm25", ids=IDS)
    assert snapshot(out) == before
    everything = TEXTS + MORE, IDS + MORE_IDS
    build_index(out, everything[0], kind="bm25", ids=everything[1])  # the newest: repaired
    assert open_kind_index(out, "sparse").rows == open_kind_index(out, "bm25").rows == 40


# 2. ------------------------------------------------------------------------------------------


@pytest.fixture
def sparse_and_bm25(tmp_path):
    out = tmp_path / "idx"
    build_index(out, TEXTS, FakeSparseEncoder(), kind="sparse", ids=IDS,
                options=SparseOptions(chunk_rows=16))  # fmt: skip
    build_index(out, TEXTS, kind="bm25", ids=IDS)
    return out


@pytest.mark.parametrize("how", ["removed", "emptied"])
def test_a_kind_whose_current_is_lost_is_reported_damaged(sparse_and_bm25, how):
    out = sparse_and_bm25
    current = out / "sparse" / layout.CURRENT
    current.unlink() if how == "removed" else current.write_text("")
    assert kinds_present(out) == ["sparse", "bm25"]  # there, but damaged
    with pytest.raises(IndexDamagedError, match=f"{current} is missing or empty"):
        HybridIndex.open(out, [FakeSparseEncoder()])
    with pytest.raises(IndexDamagedError, match=f"{current} is missing or empty"):
        open_kind_index(out, "sparse")
    line = one_error_line(cli("index", "info", str(out)))
    assert f"{current} is missing or empty" in line and "gen-000001" in line
    build_index(
        out,
        TEXTS,
        FakeSparseEncoder(),
        kind="sparse",
        ids=IDS,
        options=SparseOptions(chunk_rows=16),
    )  # fmt: skip  (the same build repairs)
    assert len(HybridIndex.open(out, [FakeSparseEncoder()]).search("w1 w2", k=3)) == 3


def test_a_file_where_a_kinds_folder_should_be_is_named(sparse_and_bm25):
    out = sparse_and_bm25
    sub = out / "sparse"
    for path in sorted(sub.rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    sub.rmdir()
    sub.write_text("x")
    with pytest.raises(IndexDamagedError, match=f"{sub} is a file"):
        HybridIndex.open(out, [FakeSparseEncoder()])
    line = one_error_line(cli("index", "info", str(out)))
    assert f"{sub} is a file" in line and "Errno" not in line
    before = snapshot(out)
    with pytest.raises(ValueError, match=f"{sub} is a file, not the sparse index's folder"):
        build_index(out, TEXTS, FakeSparseEncoder(), kind="sparse", ids=IDS)
    assert snapshot(out) == before


# 4. ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def m3(tmp_path_factory):
    pytest.importorskip("transformers")
    pytest.importorskip("usearch")
    from .xlmr_helpers import make_bge_m3

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    path = tmp_path_factory.mktemp("bge-m3")
    make_bge_m3(path, seed=11, sparse=(0.3, 0.1), colbert=(0.3, 0.1))
    return path


def dense_reference(model, texts, query):
    """bge-m3's own dense vectors: the texts' scores against the query, best first."""
    documents = model.encode(texts, sparse=False, colbert=False).dense.numpy()
    asked = model.encode([query], sparse=False, colbert=False).dense.numpy()
    scores = documents @ asked[0]  # (n,)
    order = np.lexsort((np.arange(len(texts)), -scores))
    return order, scores[order]


def test_a_dense_kind_built_by_bge_m3_searches_as_its_dense_vectors(m3, tmp_path):
    from clearformer import BGEM3Encoder

    from .xlmr_helpers import CORPUS

    model = BGEM3Encoder.from_pretrained(m3)
    out = tmp_path / "idx"
    index = build_index(out, CORPUS, model, kind="dense")
    assert index.identity.pooling == "cls" and index.identity.width == model.dim
    query = "hello fox"
    order, scores = dense_reference(model, CORPUS, query)
    for opened in (HybridIndex.open(out, [model]), HybridIndex.open(out, {"dense": model})):
        hits = opened.search(query, k=len(CORPUS), mode="dense")
        assert [hit.row for hit in hits] == order.tolist()
        np.testing.assert_allclose([hit.score for hit in hits], scores, atol=1e-5)
    with pytest.raises(ValueError, match="normalize=False"):
        model.as_dense().encode(CORPUS, normalize=False)


def test_bge_m3_builds_searches_and_adds_a_dense_kind_on_the_command_line(m3, tmp_path):
    from clearformer import BGEM3Encoder

    from .xlmr_helpers import CORPUS

    corpus = write_lines(tmp_path / "corpus.txt", CORPUS[:4])
    more = write_lines(tmp_path / "more.txt", CORPUS[4:])
    out = tmp_path / "idx"
    built = cli("index", "build", "--kind", "dense", "--corpus", str(corpus), "--out", str(out),
                "--model", str(m3), "--no-progress")  # fmt: skip
    assert built.returncode == 0, built.stderr
    added = cli("index", "add", str(out), "--corpus", str(more), "--no-progress")
    assert added.returncode == 0, added.stderr
    found = cli("search", "hello fox", "--index", str(out), "-k", "6", "--json")
    assert found.returncode == 0, found.stderr
    rows = [json.loads(line) for line in found.stdout.splitlines()]
    order, scores = dense_reference(BGEM3Encoder.from_pretrained(m3), CORPUS, "hello fox")
    assert [CORPUS.index(row["text"]) for row in rows] == order.tolist()
    np.testing.assert_allclose([row["score"] for row in rows], scores, atol=1e-5)


def test_a_plain_dense_index_refuses_bge_m3_itself_before_any_write(m3, tmp_path):
    from clearformer import BGEM3Encoder

    with pytest.raises(ValueError, match=r"got a bge-m3 model \(its dense view"):
        build_index(tmp_path / "plain", ["a text"], BGEM3Encoder.from_pretrained(m3))
    assert not (tmp_path / "plain").exists()


# 5. ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def three_kinds(tmp_path_factory):
    pytest.importorskip("usearch")
    out = tmp_path_factory.mktemp("meta") / "idx"
    build_index(out, TEXTS, FakeSparseEncoder(), kind="sparse", ids=IDS,
                options=SparseOptions(chunk_rows=16))  # fmt: skip
    build_index(out, TEXTS, FakeMultiVectorEncoder(), kind="multivector", ids=IDS,
                options=MultiVectorOptions(chunk_rows=16))  # fmt: skip
    build_index(out, TEXTS, kind="bm25", ids=IDS)
    return out


def _drop(key):
    return lambda part: part.pop(key)


def _set(key, value):
    return lambda part: part.__setitem__(key, value)


META_DAMAGE = {
    "sparse vocabulary lost": ("sparse", "options", _drop("vocabulary")),
    "sparse vocabulary another": ("sparse", "options", _set("vocabulary", 5)),
    "sparse unknown option": ("sparse", "options", _set("bogus", 1)),
    "sparse unknown engine": ("sparse", "options", _set("engine", "foo")),
    "sparse width lost": ("sparse", "model", _drop("width")),
    "sparse width a str": ("sparse", "model", _set("width", "x")),
    "multivector model lost": ("multivector", None, _drop("model")),
    "multivector model null": ("multivector", None, _set("model", None)),
    "multivector unknown option": ("multivector", "options", _set("bogus", 1)),
    "multivector repetitions a str": ("multivector", "options", _set("repetitions", "x")),
    "bm25 k1 a str": ("bm25", "options", _set("k1", "x")),
    "bm25 unknown option": ("bm25", "options", _set("bogus", 1)),
    "bm25 stopwords a number": ("bm25", "options", _set("stopwords", 5)),
    "bm25 a model": ("bm25", None, _set("model", {"name": "x"})),
}


@pytest.mark.parametrize("case", sorted(META_DAMAGE))
def test_a_damaged_kind_meta_json_is_one_error_naming_it(three_kinds, tmp_path, case):
    import shutil

    kind, part, edit = META_DAMAGE[case]
    out = tmp_path / "idx"
    shutil.copytree(three_kinds, out)
    meta_path = out / kind / GENERATION / layout.META
    meta = json.loads(meta_path.read_text())
    edit(meta if part is None else meta[part])
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(IndexDamagedError, match="meta.json") as raised:
        open_kind_index(out, kind)
    assert str(raised.value).startswith(str(meta_path))
    line = one_error_line(cli("index", "info", str(out)))
    assert line.startswith(f"clearformer index: error: {meta_path} ")


# 6. ------------------------------------------------------------------------------------------

STOP_WORDS = ["the and of", "to be or not to be", "!!!"]


def test_a_bm25_build_over_stop_words_alone_is_refused_before_anything_is_written(tmp_path):
    corpus = write_lines(tmp_path / "stop.txt", STOP_WORDS)
    out = tmp_path / "idx"
    line = one_error_line(cli("index", "build", "--kind", "bm25", "--corpus", str(corpus),
                              "--out", str(out), "--no-progress"))  # fmt: skip
    assert "none of the 3 texts holds a word BM25 indexes" in line
    assert not out.exists()
    with pytest.raises(ValueError, match="holds a word BM25 indexes"):
        build_index(out, STOP_WORDS, kind="bm25")
    assert not out.exists()
