"""Shared by the tests of an add to a folder of kinds (not a test module): a corpus cut in
three, a folder of all four kinds built over its first part, each kind's search results, and
their comparison."""

from __future__ import annotations

import numpy as np

from clearformer.index import (
    HybridIndex,
    IndexOptions,
    MultiVectorOptions,
    SparseOptions,
    build_index,
)

from .hybrid_helpers import FakeMultiVectorEncoder, FakeSparseEncoder, word_corpus

TEXTS = word_corpus(100, seed=7)
IDS = [f"doc-{i}" for i in range(len(TEXTS))]
A, B = 60, 90  # A: rows 0..59, B: rows 60..89, C: rows 90..99
CHUNK_ROWS = 16  # B is two chunks of each kind
QUERIES = ["w1 w2 w3", "w10 w40", "w5 w5 w6 w7 w8 w9", "w33 w12 w59"]


def models(dense) -> list:
    return [dense, FakeSparseEncoder(), FakeMultiVectorEncoder()]


def build_all(root, texts, ids, dense) -> None:
    """Every kind over ``texts``: dense (float32, exact), sparse, multivector, bm25."""
    build_index(root, texts, dense, kind="dense", ids=ids,
                options=IndexOptions(chunk_rows=CHUNK_ROWS))  # fmt: skip
    build_index(root, texts, FakeSparseEncoder(), kind="sparse", ids=ids,
                options=SparseOptions(chunk_rows=CHUNK_ROWS))  # fmt: skip
    build_index(root, texts, FakeMultiVectorEncoder(), kind="multivector", ids=ids,
                options=MultiVectorOptions(chunk_rows=CHUNK_ROWS))  # fmt: skip
    build_index(root, texts, kind="bm25", ids=ids)


def results(root, dense) -> dict:
    """Per kind, and fused: the best 10 hits of each query; for multivector also from only 12
    candidates, so that its MUVERA encodings, not exact MaxSim alone, decide the hits."""
    index = HybridIndex.open(root, models(dense))
    found = {mode: index.search(QUERIES, k=10, mode=mode) for mode in (*index.kinds, "hybrid")}
    if "multivector" in index.kinds:
        few = {"multivector": {"candidates": 12}}
        found["multivector/12"] = index.search(QUERIES, k=10, mode="multivector", settings=few)
    return found


def assert_same_results(got: dict, want: dict) -> None:
    """The same texts (id, row, text) in the same order; scores within 1e-6 (bm25: equal)."""
    assert list(got) == list(want)
    for mode in want:
        for found, expected in zip(got[mode], want[mode], strict=True):
            assert [(h.id, h.row, h.text) for h in found] == [
                (h.id, h.row, h.text) for h in expected
            ], mode
            scores = [h.score for h in found], [h.score for h in expected]
            if mode == "bm25":
                assert scores[0] == scores[1]
            else:
                np.testing.assert_allclose(*scores, rtol=0, atol=1e-6, err_msg=mode)


def snapshot(folder) -> list[tuple[str, int, int]]:
    """Every file under ``folder``: its path, size and modification time."""
    return sorted(
        (str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns)
        for p in folder.rglob("*")
        if p.is_file()
    )
