"""``clearformer index build / add --precision``: the texts embedded in that precision by a model
loaded in it alone (the index's vectors are that precision's embeddings, not float32's), a
multi-vector kind in bf16, int8 refused for the kinds that do not run it, in one line, before
anything is written; the index records its precision: a build in another one is written anew,
an add takes the index's by default and refuses another."""

from __future__ import annotations

import json

import numpy as np
import pytest

from clearformer import MultiVectorEncoder, TextEncoder
from clearformer.index import HybridIndex, VectorIndex
from clearformer.quant import int8_support

from .index_helpers import cli, tiny_model, word_texts
from .multivector_helpers import bert_base, st_multivector_dir

pytest.importorskip("usearch")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    texts = word_texts(60)
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n".join(texts) + "\n", encoding="utf-8")
    return path, texts


@pytest.fixture(scope="module")
def colbert(tmp_path_factory):
    """A sentence-transformers multi-vector directory on a tiny random BERT."""
    base = tmp_path_factory.mktemp("bert")
    bert_base(base)
    return st_multivector_dir(base, tmp_path_factory.mktemp("colbert"))


def stored(index_path, rows: int) -> np.ndarray:
    return VectorIndex.open(index_path).vectors(np.arange(rows))  # (rows, D) float32


needs_int8 = pytest.mark.skipif(
    not int8_support().available, reason=f"no int8 here: {int8_support().reason}"
)


@pytest.mark.parametrize("precision", ["bf16", pytest.param("int8", marks=needs_int8)])
def test_build_and_add_embed_in_the_precision_asked(tmp_path, model, corpus, precision):
    _, texts = corpus
    first, rest = tmp_path / "first.txt", tmp_path / "rest.txt"
    first.write_text("\n".join(texts[:40]) + "\n", encoding="utf-8")
    rest.write_text("\n".join(texts[40:]) + "\n", encoding="utf-8")
    index = tmp_path / "idx"
    done = cli("index", "build", "--corpus", str(first), "--out", str(index), "--model",
               str(model), "--precision", precision, "--no-progress")  # fmt: skip
    assert done.returncode == 0, done.stderr
    done = cli("index", "add", str(index), "--corpus", str(rest), "--model", str(model),
               "--precision", precision, "--no-progress")  # fmt: skip
    assert done.returncode == 0, done.stderr
    held = TextEncoder.from_pretrained(model, precision=precision)
    want = held.encode(texts, normalize=True)
    got = stored(index, len(texts))
    np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)
    # ... and not float32's: the precision did change the vectors.
    full = TextEncoder.from_pretrained(model).encode(texts, normalize=True)
    assert np.abs(got - full).max() > 1e-4


def test_a_multivector_kind_is_built_in_bf16(tmp_path, corpus, colbert):
    path, texts = corpus
    index = tmp_path / "kinds"
    done = cli("index", "build", "--corpus", str(path), "--out", str(index), "--kind",
               "multivector", "--model", str(colbert), "--precision", "bf16",
               "--no-progress")  # fmt: skip
    assert done.returncode == 0, done.stderr
    query = texts[7]
    float32 = MultiVectorEncoder.from_pretrained(colbert)
    index = HybridIndex.open(index, [float32])
    hits = index.search(query, k=3, mode="multivector", settings={"multivector": {"exact": True}})
    # The index holds bf16 document vectors: row 7 scores what they give the query.
    held = MultiVectorEncoder.from_pretrained(colbert, precision="bf16")
    q = float32.encode_query([query])
    want = float(held.similarity(q, held.encode_document([query]))[0, 0])
    full = float(float32.similarity(q, float32.encode_document([query]))[0, 0])
    seven = next(h for h in hits if h.row == 7)
    assert seven.score == pytest.approx(want, abs=1e-5)
    assert abs(want - full) > 1e-6  # bf16 documents score otherwise than float32 ones


def test_int8_for_a_kind_that_does_not_run_it_is_one_line_and_writes_nothing(
    tmp_path, corpus, colbert
):
    path, _ = corpus
    index = tmp_path / "kinds"
    done = cli("index", "build", "--corpus", str(path), "--out", str(index), "--kind",
               "multivector", "--model", str(colbert), "--precision", "int8")  # fmt: skip
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--precision int8 applies to dense models" in lines[0]
    assert "multivector model runs float32 or bf16" in lines[0]
    assert not index.exists() or not any(index.iterdir())


def test_an_index_keeps_its_precision_through_builds_and_adds(tmp_path, model, corpus):
    _, texts = corpus
    first, rest = tmp_path / "first.txt", tmp_path / "rest.txt"
    first.write_text("\n".join(texts[:40]) + "\n", encoding="utf-8")
    rest.write_text("\n".join(texts[40:]) + "\n", encoding="utf-8")
    index = tmp_path / "idx"

    def build(*flags):
        return cli("index", "build", "--corpus", str(first), "--out", str(index), "--model",
                   str(model), "--no-progress", *flags)  # fmt: skip

    full = TextEncoder.from_pretrained(model).encode(texts, normalize=True)
    half = TextEncoder.from_pretrained(model, precision="bf16").encode(texts, normalize=True)
    assert build().returncode == 0
    np.testing.assert_allclose(stored(index, 40), full[:40], atol=1e-6, rtol=0)
    # The same texts in another precision are another build: written anew, not "held".
    done = build("--precision", "bf16")
    assert done.returncode == 0 and "nothing to do" not in done.stderr
    np.testing.assert_allclose(stored(index, 40), half[:40], atol=1e-6, rtol=0)
    assert "nothing to do" in build("--precision", "bf16").stderr
    # An add in another precision is refused in one line, before any work ...
    done = cli("index", "add", str(index), "--corpus", str(rest), "--precision", "float32")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "precision must be 'bf16'" in done.stderr and "got 'float32'" in done.stderr
    assert VectorIndex.open(index).rows == 40
    # ... and an add without --precision embeds in the index's own.
    done = cli("index", "add", str(index), "--corpus", str(rest), "--no-progress")
    assert done.returncode == 0, done.stderr
    np.testing.assert_allclose(stored(index, 60), half, atol=1e-6, rtol=0)


def test_a_kind_keeps_its_precision_through_builds_and_adds(tmp_path, corpus, colbert):
    path, texts = corpus
    first = tmp_path / "first.txt"
    first.write_text("\n".join(texts[:40]) + "\n", encoding="utf-8")
    index = tmp_path / "kinds"
    query = [texts[5]]
    float32 = MultiVectorEncoder.from_pretrained(colbert)

    def score() -> float:
        opened = HybridIndex.open(index, [float32])
        hits = opened.search(query[0], k=60, mode="multivector",
                             settings={"multivector": {"exact": True}})  # fmt: skip
        return next(h.score for h in hits if h.row == 5)

    def build(*flags):
        return cli("index", "build", "--corpus", str(first), "--out", str(index), "--kind",
                   "multivector", "--model", str(colbert), "--no-progress", *flags)  # fmt: skip

    assert build().returncode == 0
    in_float32 = score()
    assert build("--precision", "bf16").returncode == 0
    held = MultiVectorEncoder.from_pretrained(colbert, precision="bf16")
    q = float32.encode_query(query)
    want = float(held.similarity(q, held.encode_document(query))[0, 0])
    assert score() == pytest.approx(want, abs=1e-5) and abs(want - in_float32) > 1e-6
    done = cli("index", "add", str(index), "--corpus", str(path), "--multivector-model",
               str(colbert), "--precision", "float32")  # fmt: skip
    assert done.returncode == 2 and "precision must be 'bf16'" in done.stderr
    done = cli("index", "add", str(index), "--corpus", str(path), "--multivector-model",
               str(colbert), "--no-progress")  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_search_encodes_a_kinds_queries_in_the_precision_asked(tmp_path, corpus, colbert):
    path, texts = corpus
    index = tmp_path / "kinds"
    done = cli("index", "build", "--corpus", str(path), "--out", str(index), "--kind",
               "multivector", "--model", str(colbert), "--no-progress")  # fmt: skip
    assert done.returncode == 0, done.stderr
    query = texts[7]
    float32 = MultiVectorEncoder.from_pretrained(colbert)
    document = float32.encode_document([query])  # the index holds float32 documents
    scores = {}
    for precision in ("float32", "bf16"):
        done = cli("search", "--index", str(index), "--mode", "multivector", "--precision",
                   precision, "--json", "-k", "60", query)  # fmt: skip
        assert done.returncode == 0, done.stderr
        hits = [json.loads(line) for line in done.stdout.splitlines()]
        scores[precision] = next(h["score"] for h in hits if h["text"] == query)
        held = MultiVectorEncoder.from_pretrained(colbert, precision=precision)
        want = float(float32.similarity(held.encode_query([query]), document)[0, 0])
        assert scores[precision] == pytest.approx(want, abs=2e-6)
    assert abs(scores["bf16"] - scores["float32"]) > 1e-5  # the queries were encoded otherwise
    done = cli("search", "--index", str(index), "--mode", "multivector", "--precision", "int8",
               query)  # fmt: skip
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "--precision int8 applies to dense models" in done.stderr
