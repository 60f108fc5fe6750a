"""Sparse, BM25 and multi-vector indexes over one texts store: each kind's search against
brute force, the shared texts, the refusals and the hybrid search."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from clearformer.index import (
    BM25Index,
    BM25Options,
    Fusion,
    HybridIndex,
    KindNotFoundError,
    ModelMismatchError,
    MultiVectorIndex,
    MultiVectorOptions,
    SparseIndex,
    SparseOptions,
    build_index,
)
from clearformer.index.ragged import token_rows
from clearformer.retrieval.maxsim import maxsim_scores

from .hybrid_helpers import FakeMultiVectorEncoder, FakeSparseEncoder, clustered_tokens, word_corpus

pytest.importorskip("usearch")
pytest.importorskip("bm25s")

QUERIES = ["w1 w2 w3", "w10 w40", "w63", "w5 w5 w6 w7 w8 w9"]


@pytest.fixture(scope="module")
def corpus():
    texts = word_corpus(150, seed=2)
    return texts, [f"doc-{i}" for i in range(len(texts))]


@pytest.fixture(scope="module")
def folder(tmp_path_factory, corpus):
    texts, ids = corpus
    root = tmp_path_factory.mktemp("kinds") / "idx"
    build_index(root, texts, FakeSparseEncoder(), kind="sparse", ids=ids,
                options=SparseOptions(chunk_rows=40))  # fmt: skip
    build_index(root, texts, kind="bm25", ids=ids)
    build_index(root, texts, FakeMultiVectorEncoder(), kind="multivector", ids=ids,
                options=MultiVectorOptions(chunk_rows=64, candidates=150))  # fmt: skip
    return root


def test_sparse_search_is_the_exact_dot_product(folder, corpus):
    texts, ids = corpus
    encoder = FakeSparseEncoder()
    index = SparseIndex.open(folder, encoder)
    exact = encoder.dense_vectors(QUERIES, True) @ encoder.dense_vectors(texts, False).T
    for query, row_scores, hits in zip(QUERIES, exact, index.search(QUERIES, k=7), strict=True):
        positive = np.flatnonzero(row_scores > 0)
        order = positive[np.lexsort((positive, -row_scores[positive]))][:7]
        assert [h.row for h in hits] == order.tolist(), query
        np.testing.assert_allclose([h.score for h in hits], row_scores[order], rtol=1e-5)
        assert [h.id for h in hits] == [ids[r] for r in order]
        assert [h.text for h in hits] == [texts[r] for r in order]


def test_sparse_query_sharing_no_term_finds_nothing(folder):
    index = SparseIndex.open(folder, FakeSparseEncoder())
    assert index.search("nothing here", k=5) == []


def test_bm25_scores_are_bm25s_own(folder, corpus):
    import bm25s

    texts, _ = corpus
    reference = bm25s.BM25(k1=1.5, b=0.75)
    reference.index(bm25s.tokenize(texts, stopwords="en", show_progress=False), show_progress=False)
    index = BM25Index.open(folder)
    for query in QUERIES:
        scores = reference.get_scores(query.split())
        hits = index.search(query, k=10)
        positive = np.flatnonzero(scores > 0)
        order = positive[np.lexsort((positive, -scores[positive]))][:10]
        assert [h.row for h in hits] == order.tolist()
        np.testing.assert_allclose([h.score for h in hits], scores[order], rtol=1e-6)
    assert index.search("the and of", k=3) == []  # stop words only: no term to match


def test_bm25_options_change_the_scores(tmp_path, corpus):
    texts, ids = corpus
    a = build_index(tmp_path / "a", texts, kind="bm25", ids=ids)
    b = build_index(tmp_path / "b", texts, kind="bm25", ids=ids, options=BM25Options(k1=0.5, b=0.2))
    assert [h.score for h in a.search(QUERIES[0])] != [h.score for h in b.search(QUERIES[0])]


def test_multivector_candidates_rescored_by_exact_maxsim(folder, corpus):
    texts, _ = corpus
    encoder = FakeMultiVectorEncoder()
    index = MultiVectorIndex.open(folder, encoder)
    documents = encoder.encode_document(texts)
    queries = encoder.encode_query(QUERIES)
    exact = maxsim_scores(queries, documents).numpy()  # (Q, n)
    for row_scores, hits in zip(exact, index.search(QUERIES, k=5), strict=True):
        np.testing.assert_allclose(
            [h.score for h in hits], np.sort(row_scores)[::-1][:5], rtol=1e-5
        )
        for hit in hits:  # every score is the exact MaxSim of its row
            assert hit.score == pytest.approx(float(row_scores[hit.row]), rel=1e-5)


def test_multivector_route_recall_on_a_synthetic_corpus(tmp_path):
    documents, queries = clustered_tokens(600, seed=3)

    class Tokens(FakeMultiVectorEncoder):
        def encode_document(self, texts, *, batch_size=None, progress=None):
            return [torch.from_numpy(documents[int(t)]) for t in texts]

    encoder = Tokens(dim=32)
    options = MultiVectorOptions(repetitions=20, projection=None, candidates=200, ann="hnsw")
    index = build_index(tmp_path / "mv", [str(i) for i in range(600)], encoder,
                        kind="multivector", options=options)  # fmt: skip
    exact_rows, exact_scores = index.search_vectors(token_rows(queries), 10, exact=True)
    reference = maxsim_scores([torch.from_numpy(q) for q in queries],
                              [torch.from_numpy(d) for d in documents]).numpy()  # fmt: skip
    np.testing.assert_allclose(exact_scores, -np.sort(-reference, axis=1)[:, :10], rtol=1e-5)

    def recall(count):
        rows, _ = index.search_vectors(token_rows(queries), 10, candidates=count)
        return np.mean([len(set(a) & set(b)) / 10 for a, b in zip(rows, exact_rows, strict=True)])

    few, many = recall(10), recall(200)
    assert many >= 0.9 > few  # the stated bound: 200 candidates of 600 (measured 0.96)


def test_hybrid_rrf_is_the_fusion_of_each_kinds_ranking(folder):
    index = HybridIndex.open(folder, [FakeSparseEncoder(), FakeMultiVectorEncoder()])
    assert index.kinds == ["sparse", "multivector", "bm25"]
    query = QUERIES[0]
    per_kind = {k: index.search(query, k=100, mode=k) for k in index.kinds}
    expected: dict[int, float] = {}
    for hits in per_kind.values():
        for rank, hit in enumerate(hits, start=1):
            expected[hit.row] = expected.get(hit.row, 0.0) + 1 / (60 + rank)
    fused = index.search(query, k=10, mode="hybrid")
    assert [h.score for h in fused] == pytest.approx(sorted(expected.values(), reverse=True)[:10])
    for hit in fused:
        assert hit.score == pytest.approx(expected[hit.row])
    only_bm25 = index.search(query, k=10, mode="hybrid", kinds=["bm25"])
    assert [h.row for h in only_bm25] == [h.row for h in per_kind["bm25"][:10]]
    weighted = index.search(query, k=5, mode="hybrid", kinds=["sparse", "bm25"],
                            fusion=Fusion("weighted", weights={"bm25": 0.0}))  # fmt: skip
    assert [h.row for h in weighted] == [h.row for h in per_kind["sparse"][:5]]


def test_a_kind_the_index_lacks_is_refused_naming_the_kinds(tmp_path, corpus):
    texts, ids = corpus
    build_index(tmp_path / "b", texts, kind="bm25", ids=ids)
    index = HybridIndex.open(tmp_path / "b")
    with pytest.raises(KindNotFoundError, match=r"holds no sparse index \(it holds bm25\)"):
        index.search("w1", mode="sparse")
    with pytest.raises(KindNotFoundError, match=r"holds no dense index \(it holds bm25\)"):
        HybridIndex.open(tmp_path / "b", kinds=["dense"])
    with pytest.raises(ValueError, match="mode must be one of"):
        index.search("w1", mode="colbert")


def test_shared_texts_store_and_refusal_of_other_texts(folder, corpus, tmp_path):
    texts, ids = corpus
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) == [
        "bm25", "multivector", "sparse", "texts",
    ]  # fmt: skip
    before = sorted(str(p) for p in folder.rglob("*"))
    with pytest.raises(ValueError, match="holds an index of other texts"):
        build_index(folder, texts[:-1] + ["w1 w2"], kind="bm25", ids=ids)
    with pytest.raises(ValueError, match="holds an index of other texts"):
        build_index(folder, texts, kind="bm25", ids=[f"x{i}" for i in range(len(texts))])
    assert sorted(str(p) for p in folder.rglob("*")) == before  # nothing changed


def test_model_of_another_kind_or_identity_is_refused(folder, corpus, tmp_path):
    texts, ids = corpus
    with pytest.raises(
        ValueError, match="a multivector index needs a multivector model, got a sparse"
    ):
        build_index(tmp_path / "x", texts, FakeSparseEncoder(), kind="multivector")
    with pytest.raises(ValueError, match="a bm25 index uses no model"):
        build_index(tmp_path / "x", texts, FakeSparseEncoder(), kind="bm25")
    with pytest.raises(ValueError, match="kind must be one of"):
        build_index(tmp_path / "x", texts, FakeSparseEncoder(), kind="splade")
    assert not (tmp_path / "x").exists()
    # The advice names the flag that gives a sparse search its model (--model is refused there).
    with pytest.raises(ModelMismatchError, match=r"differs in revision.*\(--sparse-model "):
        SparseIndex.open(folder, FakeSparseEncoder(seed=1))


def test_the_same_build_again_commits_nothing(folder, corpus):
    texts, ids = corpus
    generation = (folder / "sparse" / "CURRENT").read_text()
    encoder = FakeSparseEncoder()
    build_index(
        folder, texts, encoder, kind="sparse", ids=ids, options=SparseOptions(chunk_rows=40)
    )
    assert (folder / "sparse" / "CURRENT").read_text() == generation
    assert encoder.calls == 0


def test_seismic_engine_rescores_its_candidates_exactly(tmp_path, corpus):
    pytest.importorskip("seismic")
    texts, ids = corpus
    encoder = FakeSparseEncoder()
    index = build_index(tmp_path / "s", texts, encoder, kind="sparse", ids=ids,
                        options=SparseOptions(engine="seismic", candidates=150))  # fmt: skip
    assert (index.folder / "sparse.index.seismic").is_file()
    exact = encoder.dense_vectors(QUERIES, True) @ encoder.dense_vectors(texts, False).T
    for query, row_scores in zip(QUERIES, exact, strict=True):
        hits = index.search(query, k=5)
        for hit in hits:  # every score is the exact dot product of its row
            assert hit.score == pytest.approx(float(row_scores[hit.row]), rel=1e-5)
        # 150 candidates of 150 documents: Seismic's approximation cannot lose one here
        best = np.sort(row_scores[row_scores > 0])[::-1][:5]
        np.testing.assert_allclose([h.score for h in hits], best, rtol=1e-5)
    with pytest.raises(ValueError, match="engine must be one of"):
        SparseOptions(engine="tantivy")


def test_a_bge_m3_model_serves_its_sparse_and_multivector_views(folder):
    class FakeBGEM3:
        kind = "bge-m3"

        def as_sparse(self):
            return FakeSparseEncoder()

        def as_multivector(self):
            return FakeMultiVectorEncoder()

    index = HybridIndex.open(folder, [FakeBGEM3()])
    plain = HybridIndex.open(folder, [FakeSparseEncoder(), FakeMultiVectorEncoder()])
    for mode in ("sparse", "multivector", "hybrid"):
        got = index.search(QUERIES[1], k=5, mode=mode)
        assert [h.row for h in got] == [h.row for h in plain.search(QUERIES[1], k=5, mode=mode)]
    assert isinstance(index.indexes["sparse"].encoder, FakeSparseEncoder)


def test_a_model_of_the_kind_itself_serves_it_before_a_bge_m3_view_in_any_order(folder):
    class OtherBGEM3:  # its sparse view is another model than the one the index was built with
        kind = "bge-m3"

        def as_sparse(self):
            return FakeSparseEncoder(seed=1)

        def as_multivector(self):
            return FakeMultiVectorEncoder()

    for models in ([OtherBGEM3(), FakeSparseEncoder()], [FakeSparseEncoder(), OtherBGEM3()]):
        index = HybridIndex.open(folder, models)
        assert index.indexes["sparse"].encoder.seed == 0  # the SPLADE model given, not the view
        assert isinstance(index.indexes["multivector"].encoder, FakeMultiVectorEncoder)


def test_per_call_settings_reach_the_kind(folder):
    index = HybridIndex.open(folder, [FakeSparseEncoder(), FakeMultiVectorEncoder()])
    few = index.search(
        QUERIES[3], k=10, mode="multivector", settings={"multivector": {"candidates": 10}}
    )
    exact = index.search(
        QUERIES[3], k=10, mode="multivector", settings={"multivector": {"exact": True}}
    )
    scores = [h.score for h in exact]
    assert scores == sorted(scores, reverse=True)
    assert sum(h.score for h in few) <= sum(scores) + 1e-4  # 10 candidates: no better than exact
    with pytest.raises(TypeError, match="a bm25 search takes no candidates"):
        index.search("w1", mode="bm25", settings={"bm25": {"candidates": 5}})
