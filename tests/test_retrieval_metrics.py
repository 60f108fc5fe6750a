"""clearformer's retrieval metrics against trec_eval itself (pytrec_eval binds its C code):
every measure on random runs with tied scores, several relevant documents, graded and
negative levels, and qrels naming documents the run never retrieved."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clearformer.retrieval.comparison import compare
from clearformer.retrieval.metrics import (
    evaluate_run,
    mean_measures,
    parse_measure,
    query_measures,
    ranked,
)

pytrec_eval = pytest.importorskip("pytrec_eval")

OURS_TO_TREC = {
    "ndcg@3": "ndcg_cut_3",
    "ndcg@10": "ndcg_cut_10",
    "recall@1": "recall_1",
    "recall@10": "recall_10",
    "recall@100": "recall_100",
    "map@100": "map_cut_100",
    "precision@5": "P_5",
}
TREC_MEASURES = {"ndcg_cut.3,10", "recall.1,10,100", "map_cut.100", "P.5"}

documents = st.sampled_from([f"d{i}" for i in range(40)])
# Few distinct scores, so that ties are common: their order is the point.
# float64 scores a few float64 steps from a float32 one are ties to trec_eval (it holds C
# floats): reciprocal-rank fusion's sums give such scores.
near_float32 = st.builds(
    lambda base, steps: base + steps * abs(base) * 2.0**-50,  # a few float64 steps away
    st.floats(-5, 5, width=32),
    st.integers(-3, 3),
)
scores = st.one_of(
    st.sampled_from([0.0, 0.25, 0.5, 1.0, 1.0 + 1e-12, 1.0 - 1e-12]),
    st.floats(-5, 5, width=32),
    near_float32,
)
runs = st.dictionaries(documents, scores, min_size=1, max_size=30)
qrels = st.dictionaries(documents, st.sampled_from([-1, 0, 1, 1, 2, 3]), min_size=1, max_size=8)


def _trec(run: dict, judged: dict) -> dict | None:
    evaluated = pytrec_eval.RelevanceEvaluator({"q": judged}, TREC_MEASURES).evaluate({"q": run})
    return evaluated.get("q")


@settings(max_examples=400, deadline=None)
@given(run=runs, judged=qrels)
def test_every_measure_equals_trec_eval(run, judged):
    reference = _trec(run, judged)
    ours = query_measures(run, judged, list(OURS_TO_TREC))
    if reference is None:  # trec_eval skips a query with no relevant document; ours gives 0
        assert all(value == 0.0 for value in ours.values())
        return
    for name, trec_name in OURS_TO_TREC.items():
        assert abs(ours[name] - reference[trec_name]) <= 1e-9, (name, run, judged)


@settings(max_examples=300, deadline=None)
@given(run=runs, judged=qrels)
def test_mrr_at_10_is_trec_evals_reciprocal_rank_over_its_top_10(run, judged):
    top = {doc: run[doc] for doc in ranked(run)[:10]}
    evaluated = pytrec_eval.RelevanceEvaluator({"q": judged}, {"recip_rank"}).evaluate({"q": top})
    reference = evaluated["q"]["recip_rank"] if "q" in evaluated else 0.0
    assert abs(query_measures(run, judged, ["mrr@10"])["mrr@10"] - reference) <= 1e-9


def test_ties_are_broken_by_document_id_descending_as_trec_eval_does():
    # Every score equal: trec_eval ranks d9 first, so only the descending order finds it at 1.
    run = {"d1": 1.0, "d5": 1.0, "d9": 1.0}
    judged = {"d9": 1}
    assert ranked(run) == ["d9", "d5", "d1"]
    assert query_measures(run, judged, ["mrr@10"])["mrr@10"] == 1.0
    assert _trec(run, judged)["recall_1"] == 1.0
    # Written the other way round (ascending), the measure would be 1/3: the test can fail.
    assert query_measures({"d1": 1.0, "d5": 1.0, "d9": 1.0}, {"d1": 1}, ["mrr@10"])[
        "mrr@10"
    ] == pytest.approx(1 / 3)


def test_scores_equal_in_float32_are_a_tie_as_in_trec_eval():
    # 1 + 1e-9 is 1.0 as a C float: a tie, broken by id descending (b before a).
    run = {"a": 1.0 + 1e-9, "b": 1.0}
    assert ranked(run) == ["b", "a"]
    ours = query_measures(run, {"a": 1}, ["ndcg@10", "mrr@10"])
    assert ours["mrr@10"] == 0.5
    assert abs(ours["ndcg@10"] - _trec(run, {"a": 1})["ndcg_cut_10"]) <= 1e-12


def test_graded_relevance_and_unretrieved_judged_documents_count():
    run = {"a": 3.0, "b": 2.0, "c": 1.0}
    judged = {"a": 1, "c": 2, "z": 3}  # z is never retrieved: it still counts in the ideal
    ours = query_measures(run, judged, ["ndcg@10", "recall@10", "map@100"])
    reference = _trec(run, judged)
    assert ours["ndcg@10"] == pytest.approx(reference["ndcg_cut_10"], abs=1e-12)
    assert ours["recall@10"] == pytest.approx(2 / 3)
    assert ours["map@100"] == pytest.approx((1 / 1 + 2 / 3) / 3)


def test_a_query_missing_from_the_run_scores_zero_and_counts_in_the_mean():
    qrels = {"q1": {"a": 1}, "q2": {"b": 1}}
    per_query = evaluate_run({"q1": {"a": 1.0}}, qrels, ["recall@10"])
    assert per_query == {"q1": {"recall@10": 1.0}, "q2": {"recall@10": 0.0}}
    assert mean_measures(per_query) == {"recall@10": 0.5}


@pytest.mark.parametrize("name", ["ndcg", "ndcg@0", "ndcg@x", "f1@10", "recall@-1"])
def test_unknown_measures_are_refused_by_name(name):
    with pytest.raises(ValueError, match="measure must be one of"):
        parse_measure(name)


def test_paired_bootstrap_interval_excludes_zero_only_for_a_real_difference():
    queries = [f"q{i}" for i in range(200)]
    better = {q: {"m@10": 1.0 if i % 2 else 0.5} for i, q in enumerate(queries)}
    worse = {q: {"m@10": 0.5} for q in queries}
    (difference,) = compare(better, worse)
    assert difference.delta == pytest.approx(0.25)
    assert difference.low > 0 and difference.significant
    (same,) = compare(worse, worse)
    assert same.delta == 0 and not same.significant
    # A difference in a handful of queries in either direction is noise.
    mixed = {q: {"m@10": 0.5 + (0.1 if i % 2 else -0.1)} for i, q in enumerate(queries)}
    (noise,) = compare(mixed, worse)
    assert noise.low < 0 < noise.high and not noise.significant
    with pytest.raises(ValueError, match="different queries"):
        compare(better, {"q0": {"m@10": 1.0}})
