"""``clearformer eval --mode``: BM25 through bm25s scores BBC News as the BM25 row of
docs/retrieval.md; sparse and multi-vector exact runs are brute force and their indexes agree;
a hybrid run is the fusion of the kinds' runs written out by hand."""

from __future__ import annotations

import json

import pytest

from clearformer.index import Fusion
from clearformer.retrieval import EvalSettings, evaluate, load_beir
from clearformer.retrieval.metrics import ranked
from clearformer.retrieval.trec import read_run

from .contrastive_helpers import write_retrieval_data, write_sentence_transformer
from .hybrid_helpers import FakeMultiVectorEncoder, FakeSparseEncoder
from .index_helpers import cli

pytest.importorskip("bm25s")
pytest.importorskip("pytrec_eval")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval-modes")
    model = write_sentence_transformer(root / "st")
    _, beir = write_retrieval_data(root / "data", rows=40)
    return model, beir


def test_bm25_on_bbc_is_the_documented_row(tmp_path):
    from clearformer.retrieval.bbc import write_bbc_benchmark

    write_bbc_benchmark(tmp_path / "bbc")
    out = tmp_path / "bm25.json"
    result = cli("eval", "--data", str(tmp_path / "bbc"), "--mode", "bm25", "--index",
                 str(tmp_path / "idx"), "--out", str(out), "--no-progress")  # fmt: skip
    assert result.returncode == 0, result.stderr
    written = json.loads(out.read_text())
    assert round(written["metrics"]["ndcg@10"], 4) == 0.8193  # docs/retrieval.md, BM25 row
    assert written["settings"]["mode"] == "bm25" and written["settings"]["kinds"] == ["bm25"]
    exact = evaluate(load_beir(tmp_path / "bbc"), None, EvalSettings(mode="bm25"))
    assert exact.metrics == pytest.approx(written["metrics"])


def test_sparse_and_multivector_exact_runs_match_their_indexes(tiny, tmp_path):
    _, beir = tiny
    data = load_beir(beir)
    for kind, model in (("sparse", FakeSparseEncoder()), ("multivector", FakeMultiVectorEncoder())):
        exact = evaluate(data, None, EvalSettings(mode=kind), models={kind: model})
        indexed = evaluate(data, None, EvalSettings(mode=kind, index=str(tmp_path / "idx")),
                           models={kind: model})  # fmt: skip
        assert indexed.settings["index"] is not None and indexed.settings["mode"] == kind
        # the index search is exact for sparse; for multivector every candidate is rescored by
        # exact MaxSim and a small corpus fits in the candidate list
        assert indexed.metrics == pytest.approx(exact.metrics)
        assert exact.model["revision"] == model.identity.revision


def test_hybrid_run_is_the_fusion_of_the_kinds_runs(tiny):
    model, beir = tiny
    from clearformer import TextEncoder

    data = load_beir(beir)
    encoder = TextEncoder.from_pretrained(model)
    sparse = FakeSparseEncoder()
    runs = {
        "dense": evaluate(data, encoder, EvalSettings()).run,
        "sparse": evaluate(data, None, EvalSettings(mode="sparse"), models={"sparse": sparse}).run,
        "bm25": evaluate(data, None, EvalSettings(mode="bm25")).run,
    }
    for fusion in (Fusion(), Fusion("weighted", weights={"bm25": 0.5}, normalization="zscore")):
        settings = EvalSettings(
            mode="hybrid",
            fusion=fusion.method,
            weights=dict(fusion.weights) or None,
            normalization=fusion.normalization,
        )
        result = evaluate(data, encoder, settings, models={"sparse": sparse})
        assert result.settings["kinds"] == ["dense", "sparse", "bm25"]
        for query, fused in result.run.items():
            rankings = {
                k: [(d, run[query][d]) for d in ranked(run[query])] for k, run in runs.items()
            }
            expected = dict(fusion.fuse(rankings, 100))
            assert fused == pytest.approx(expected)
    with pytest.raises(ValueError, match="the multivector kind needs a multivector model"):
        evaluate(data, encoder, EvalSettings(mode="hybrid", kinds=("dense", "multivector")))


def test_eval_mode_flags_are_checked_before_any_work(tiny, tmp_path):
    _, beir = tiny
    result = cli("eval", "--data", str(beir), "--mode", "sparse")
    assert result.returncode == 2 and "--mode sparse needs --sparse-model DIR" in result.stderr
    result = cli("eval", "--data", str(beir), "--mode", "bm25", "--fusion", "weighted")
    assert result.returncode == 2 and "--fusion applies to --mode hybrid" in result.stderr
    result = cli("eval", "--data", str(beir), "--mode", "bm25", "--storage", "int8", "--index",
                 str(tmp_path / "i"))  # fmt: skip
    assert result.returncode == 2 and "describe a dense index" in result.stderr
    assert not (tmp_path / "i").exists()


def test_a_kind_asked_of_a_lone_dense_index_names_no_flag_eval_lacks(tiny, tmp_path):
    # eval has no --kind: the refusal says what the folder is and what to do, in its words.
    model, beir = tiny
    dense = cli("eval", "--data", str(beir), "--model", str(model), "--index",
                str(tmp_path / "d.idx"), "--no-progress")  # fmt: skip
    assert dense.returncode == 0, dense.stderr
    result = cli("eval", "--data", str(beir), "--mode", "bm25", "--index", str(tmp_path / "d.idx"))
    assert result.returncode == 2 and "dense index built on its own" in result.stderr
    assert "--kind" not in result.stderr


def test_a_kind_is_embedded_in_the_precision_asked(tiny, tmp_path):
    from clearformer import MultiVectorEncoder

    from .multivector_helpers import bert_base, st_multivector_dir

    _, beir = tiny
    base = tmp_path / "bert"
    base.mkdir()
    bert_base(base)
    colbert = st_multivector_dir(base, tmp_path / "colbert")
    out, run = tmp_path / "bf16.json", tmp_path / "bf16.run"
    result = cli("eval", "--data", str(beir), "--mode", "multivector", "--multivector-model",
                 str(colbert), "--precision", "bf16", "--out", str(out), "--run-out", str(run),
                 "--no-progress")  # fmt: skip
    assert result.returncode == 0, result.stderr
    data = load_beir(beir)
    settings = EvalSettings(mode="multivector")
    held = MultiVectorEncoder.from_pretrained(colbert, precision="bf16")
    want = evaluate(data, None, settings, models={"multivector": held})
    assert json.loads(out.read_text())["metrics"] == pytest.approx(want.metrics)
    scores = read_run(run)  # the scores are bf16 documents' and queries', not float32's
    query = next(iter(want.run))
    assert scores[query] == pytest.approx(want.run[query], abs=1e-5)
    float32 = MultiVectorEncoder.from_pretrained(colbert)
    full = evaluate(data, None, settings, models={"multivector": float32}).run[query]
    assert max(abs(full[d] - scores[query][d]) for d in scores[query]) > 1e-6
    # int8, which only dense models run, is refused by name before any work.
    result = cli("eval", "--data", str(beir), "--mode", "multivector", "--multivector-model",
                 str(colbert), "--precision", "int8")  # fmt: skip
    assert result.returncode == 2
    assert "--precision int8 applies to dense models; a multivector model" in result.stderr


def test_bm25s_exact_run_is_the_indexs_search(tiny, tmp_path):
    """The same documents in the same order as BM25Index gives: none sharing no word with the
    query (bm25s's retrieve would fill the depth with them, scoring 0)."""
    from clearformer.retrieval.kind_runs import bm25_run

    _, beir = tiny
    data = load_beir(beir)
    exact = bm25_run(data.query_ids, data.query_texts, data.corpus_ids, data.corpus_texts, 100)
    indexed = evaluate(data, None, EvalSettings(mode="bm25", index=str(tmp_path / "idx"))).run
    assert any(len(exact[q]) < len(data.corpus_ids) for q in data.query_ids)  # some left out
    for query in data.query_ids:
        assert ranked(exact[query]) == ranked(indexed[query]), query
        assert all(score > 0 for score in exact[query].values())
        got = [exact[query][d] for d in ranked(exact[query])]
        want = [indexed[query][d] for d in ranked(exact[query])]
        assert got == pytest.approx(want, rel=1e-6)


def test_multivector_exact_run_ranks_documents_of_negative_maxsim_too():
    import torch

    from clearformer.retrieval.kind_runs import multivector_exact_run

    query = torch.tensor([[1.0, 0.0]])  # one token
    documents = [
        torch.tensor([[0.5, 0.5]]),
        torch.tensor([[-1.0, 0.0]]),
        torch.tensor([[0.0, 1.0]]),
    ]
    run = multivector_exact_run(["q"], [query], ["a", "b", "c"], documents, 10)
    assert ranked(run["q"]) == ["a", "c", "b"]  # MaxSim 0.5, 0, -1: every document ranked
