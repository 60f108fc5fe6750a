"""Retrieval metrics, each computed as trec_eval computes it.

A run gives each query a score per document; qrels give each query a relevance level per
judged document. trec_eval (and ``pytrec_eval``, its Python binding, which BEIR and
sentence-transformers' tooling use) fixes three things that decide every figure, and this module
follows them exactly so that its numbers and trec_eval's are the same:

* **the order**: documents by score, highest first, the scores as C floats (float32); equal
  scores by document id, *descending* (trec_eval's ``comp_sim_docno``), never by the order
  they were written;
* **relevant** means a level of at least 1; ``num_rel``, the denominator of recall and MAP,
  counts every relevant judged document, retrieved or not (qrels naming documents absent
  from the run still count);
* **gains** for NDCG are the levels themselves (graded), discounted by ``log2(rank + 1)``;
  the ideal ranking sorts the query's judged levels, highest first.

A query with no relevant document scores 0 on every measure, as in trec_eval.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

Run = Mapping[str, Mapping[str, float]]  # query id -> document id -> score
Qrels = Mapping[str, Mapping[str, int]]  # query id -> document id -> relevance level

# The measures `clearformer eval` reports, in the order of its table.
DEFAULT_MEASURES = ("ndcg@10", "mrr@10", "recall@1", "recall@10", "recall@100", "map@100")
KINDS = ("ndcg", "mrr", "recall", "map", "precision")


def ranked(scores: Mapping[str, float]) -> list[str]:
    """Document ids in trec_eval's order: score descending, then document id descending.

    trec_eval holds a score as a C ``float``: two scores equal once rounded to float32 are a
    tie (reciprocal-rank fusion's sums of the same ranks in another order differ in
    float64's last bit, for one)."""
    import numpy as np  # here: the CLI's parser reads this module's names, numpy unloaded

    # By id descending first, then a stable sort by the float32 score descending (ties keep
    # the first).
    by_id = sorted(scores, reverse=True)
    values = np.fromiter((scores[doc] for doc in by_id), dtype=np.float64, count=len(by_id))
    order = np.argsort(-values.astype(np.float32), kind="stable")  # (documents,)
    return [by_id[i] for i in order.tolist()]


def parse_measure(name: str) -> tuple[str, int]:
    """``"ndcg@10"`` -> ``("ndcg", 10)``; a clear error for anything else."""
    kind, at, cutoff = name.partition("@")
    if kind not in KINDS or not at or not cutoff.isdigit() or int(cutoff) <= 0:
        raise ValueError(
            f"measure must be one of {', '.join(k + '@K' for k in KINDS)} with K a positive "
            f"integer, got {name!r}"
        )
    return kind, int(cutoff)


def query_measures(
    scores: Mapping[str, float], judged: Mapping[str, int], measures: Sequence[str]
) -> dict[str, float]:
    """Each of ``measures`` for one query: its run ``scores`` against its ``judged`` levels."""
    parsed = [(name, *parse_measure(name)) for name in measures]
    depth = max(cutoff for _, _, cutoff in parsed)
    order = ranked(scores)[:depth]
    levels = [judged.get(doc, 0) for doc in order]  # (depth,) the level at each rank
    num_rel = sum(1 for level in judged.values() if level >= 1)
    ideal = sorted((level for level in judged.values() if level > 0), reverse=True)
    return {name: _measure(kind, cutoff, levels, num_rel, ideal) for name, kind, cutoff in parsed}


def _measure(kind: str, k: int, levels: list[int], num_rel: int, ideal: list[int]) -> float:
    top = levels[:k]
    if num_rel == 0:
        return 0.0
    if kind == "recall":
        return sum(1 for level in top if level >= 1) / num_rel
    if kind == "precision":
        return sum(1 for level in top if level >= 1) / k
    if kind == "mrr":
        return next((1.0 / rank for rank, level in enumerate(top, 1) if level >= 1), 0.0)
    if kind == "map":
        hits, total = 0, 0.0
        for rank, level in enumerate(top, 1):
            if level >= 1:
                hits += 1
                total += hits / rank
        return total / num_rel
    # ndcg: a level below 1 gains nothing (trec_eval's default gains are the positive levels)
    dcg = sum(level / math.log2(rank + 1) for rank, level in enumerate(top, 1) if level > 0)
    best = sum(level / math.log2(rank + 1) for rank, level in enumerate(ideal[:k], 1))
    return dcg / best if best > 0 else 0.0


def evaluate_run(
    run: Run, qrels: Qrels, measures: Sequence[str] = DEFAULT_MEASURES
) -> dict[str, dict[str, float]]:
    """Per-query measures: query id -> measure -> value, for every query of ``qrels`` (a
    query the run lacks retrieved nothing and scores 0, as ``trec_eval -c`` counts it)."""
    for name in measures:
        parse_measure(name)
    return {
        query: query_measures(run.get(query, {}), judged, measures)
        for query, judged in qrels.items()
    }


def mean_measures(per_query: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """The mean of each measure over the queries (0 for none)."""
    queries = list(per_query.values())
    if not queries:
        return {}
    names = list(queries[0])
    return {name: math.fsum(q[name] for q in queries) / len(queries) for name in names}
