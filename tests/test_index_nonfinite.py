"""A text whose embedding holds a NaN or an infinity stops a build or an add before its chunk
is committed, for every kind: the index is left as it was. A committed NaN row would be found
by no search, and in an int8 index it would take the ranges of every dimension with it."""

from __future__ import annotations

import os

import pytest
import torch

from clearformer.index import IndexOptions, SparseOptions, add_to_index, build_index, layout
from clearformer.text import TextEncoder

from .hybrid_helpers import FakeMultiVectorEncoder, FakeSparseEncoder, word_corpus
from .index_helpers import WORDS, tiny_model, word_texts

pytest.importorskip("usearch")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

POISON = "w7"  # the word whose embedding becomes NaN


@pytest.fixture(scope="module")
def poisoned(tmp_path_factory):
    encoder = TextEncoder.from_pretrained(tiny_model(tmp_path_factory.mktemp("tiny")))
    word = WORDS.index(POISON)  # the tiny checkpoint's vocabulary
    with torch.no_grad():
        encoder.model.embeddings.word.weight[word] = float("nan")
    return encoder


def files_of(root):
    return sorted(p.relative_to(root) for p in root.rglob("*") if "staging" not in p.parts)


@pytest.mark.parametrize("storage", ["float32", "int8"])
def test_a_build_stops_before_a_nan_row_is_committed(tmp_path, poisoned, storage):
    texts = [t for t in word_texts(40) if POISON not in t.split()]
    texts[25] = f"w1 {POISON} w2"
    with pytest.raises(ValueError, match=r"not finite .* texts 25 \('w1 w7 w2'\)"):
        build_index(tmp_path / "idx", texts, poisoned, options=IndexOptions(storage=storage))
    assert layout.current_generation(tmp_path / "idx") is None


def test_an_add_stops_before_a_nan_row_is_committed(tmp_path, poisoned):
    clean = [t for t in word_texts(40) if POISON not in t.split()]
    root = tmp_path / "idx"
    build_index(root, clean[:30], poisoned, options=IndexOptions(storage="int8"))
    before = {p: (root / p).read_bytes() for p in files_of(root) if (root / p).is_file()}
    with pytest.raises(ValueError, match="not finite"):
        add_to_index(root, [*clean[30:], f"{POISON} w3"], poisoned)
    after = {p: (root / p).read_bytes() for p in files_of(root) if (root / p).is_file()}
    assert after == before


class NanSparseEncoder(FakeSparseEncoder):
    def encode_document(self, texts, **options):
        batch = super().encode_document(texts, **options)
        values = batch.values().clone()
        values[-1] = float("nan")  # the last row's last term
        return torch.sparse_coo_tensor(
            batch.indices(), values, batch.shape, check_invariants=True
        ).coalesce()


class InfMultiVectorEncoder(FakeMultiVectorEncoder):
    def encode_document(self, texts, **options):
        rows = super().encode_document(texts, **options)
        rows[2][0, 3] = float("inf")
        return rows


@pytest.mark.parametrize(
    ("kind", "encoder", "row"),
    [("sparse", NanSparseEncoder(), 15), ("multivector", InfMultiVectorEncoder(), 2)],
)
def test_sparse_and_multivector_rows_are_checked_too(tmp_path, kind, encoder, row):
    texts = word_corpus(16, seed=3)
    options = SparseOptions(chunk_rows=16) if kind == "sparse" else None
    with pytest.raises(ValueError, match=rf"1 of 16 texts are not finite .* texts {row} "):
        build_index(tmp_path / "idx", texts, encoder, kind=kind, options=options)
    assert not list((tmp_path / "idx" / kind).glob("generations/*"))
