"""The search stages an evaluation runs, each giving a run: query id -> {document id: score}.

* :func:`exact_run`: brute force, every document's cosine to every query (the reference a
  faster stage is measured against);
* :func:`index_run`: a persistent index (:class:`~clearformer.index.VectorIndex`), searched as
  ``clearformer search --index`` searches it (graph or scan, stored as float32 / int8 / binary,
  rescored in float32);
* :func:`rerank_run`: a cross-encoder rescoring each query's first ``top`` documents, its
  order taken as it is or fused with the first stage's (reciprocal rank fusion).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import numpy as np
import torch

from ..options import RERANK_FUSIONS
from .metrics import ranked

log = logging.getLogger(__name__)

Run = dict[str, dict[str, float]]
_QUERY_BLOCK = 256  # queries scored against the whole corpus at a time: (256, n) float32 scores


def exact_run(
    query_ids: Sequence[str],
    queries: np.ndarray,
    corpus_ids: Sequence[str],
    corpus: np.ndarray,
    depth: int,
) -> Run:
    """The ``depth`` best documents of each query by cosine (rows are unit vectors).

    Args:
        queries: (Q, d) float32 unit rows; corpus: (n, d) float32 unit rows.
    """
    depth = min(depth, len(corpus_ids))
    corpus_t = torch.from_numpy(np.ascontiguousarray(corpus, dtype=np.float32))  # (n, d)
    run: Run = {}
    for start in range(0, len(query_ids), _QUERY_BLOCK):
        block = torch.from_numpy(np.ascontiguousarray(queries[start : start + _QUERY_BLOCK]))
        scores = block @ corpus_t.T  # (b, n) cosines
        top = torch.topk(scores, depth, dim=1)  # (b, depth) values and rows
        for i, (values, rows) in enumerate(zip(top.values, top.indices, strict=True)):
            run[query_ids[start + i]] = {
                corpus_ids[row]: float(value)
                for row, value in zip(rows.tolist(), values.tolist(), strict=True)
            }
    return run


def index_run(query_ids: Sequence[str], queries: np.ndarray, index, depth: int) -> Run:
    """The ``depth`` best documents of each query from ``index`` (its own truncation and
    storage); ``queries`` are (Q, D) float32 unit rows at the model's full width."""
    from ..index.quantize import truncate

    vectors = truncate(queries, index.dimensions)  # (Q, d) as the index's rows were cut
    depth = min(depth, index.rows)
    rows, scores = index.search_vectors(vectors, depth)  # (Q, depth) each
    hits = index.hits(rows, scores)
    return {
        query: {hit.id: hit.score for hit in found}
        for query, found in zip(query_ids, hits, strict=True)
    }


def rerank_run(
    run: Run,
    query_text: dict[str, str],
    document_text: dict[str, str],
    score_pairs: Callable[[list[tuple[str, str]]], np.ndarray],
    top: int,
    *,
    fusion: str = "none",
    rrf_k: int = 60,
) -> Run:
    """Each query's first ``top`` documents rescored by ``score_pairs`` (a cross-encoder's
    predict), ranked above the rest, which keep the first stage's order below them.

    With ``fusion="rrf"`` the head's order is reciprocal rank fusion of the cross-encoder's
    order and the first stage's (``1 / (rrf_k + rank)`` summed over the two): a cross-encoder
    trained on little data and a fine-tuned first stage are wrong on different documents, and
    the fusion keeps what each gets right without a weight to tune.

    All pairs go to ``score_pairs`` in one call, so that its batching sorts them by length
    across queries.
    """
    from ..index.fusion import reciprocal_rank_fusion

    if fusion not in RERANK_FUSIONS:
        raise ValueError(f"rerank fusion must be one of {RERANK_FUSIONS}, got {fusion!r}")
    heads = {query: ranked(scores)[:top] for query, scores in run.items()}
    pairs = [(query_text[q], document_text[d]) for q, docs in heads.items() for d in docs]
    log.info("rerank: %d pairs", len(pairs))
    scores = np.asarray(score_pairs(pairs), dtype=np.float64).reshape(-1)
    out: Run = {}
    at = 0
    for query, docs in heads.items():
        reranked = dict(zip(docs, scores[at : at + len(docs)].tolist(), strict=True))
        at += len(docs)
        if fusion == "rrf":
            first = [(d, run[query][d]) for d in docs]
            second = [(d, reranked[d]) for d in ranked(reranked)]
            reranked = dict(reciprocal_rank_fusion([first, second], rrf_k, len(docs)))
        floor = min(reranked.values(), default=0.0)
        # The documents below the reranked head keep their first-stage order, each one step
        # below the last: their scores say order only, not relevance.
        tail = [d for d in ranked(run[query]) if d not in reranked]
        reranked.update({d: floor - 1.0 - i for i, d in enumerate(tail)})
        out[query] = reranked
    return out
