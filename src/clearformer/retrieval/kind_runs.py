"""First-stage runs of the sparse, multi-vector and BM25 kinds, exact or through an index, and
their fusion (``clearformer eval --mode``).

* exact: BM25 by bm25s in memory (as ``benchmarks/retrieval_bbc.py`` computes the BM25 row),
  sparse by the exact dot product of every document with every query, multi-vector by MaxSim
  against every document;
* through an index: the kind's sub-index at ``settings.index`` (built there from the corpus
  first if it lacks that kind), searched as ``clearformer search --index --mode`` does;
* hybrid: each kind's run fused by :class:`~clearformer.index.Fusion` on document ids.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .stages import Run

log = logging.getLogger(__name__)


def kind_run(kind: str, data, model: Any, settings, report) -> Run:
    """The ``settings.depth`` best documents of every query of ``data`` by ``kind``."""
    depth = min(settings.depth, len(data.corpus_ids))
    if settings.index is not None:
        return _index_run(kind, data, model, settings, depth, report)
    if kind == "bm25":
        return bm25_run(data.query_ids, data.query_texts, data.corpus_ids, data.corpus_texts, depth)
    from ..index.kinds import encoder_for

    view = encoder_for(kind, model, f"--mode {kind}")
    report("corpus", 0, len(data.corpus_texts))
    documents = view.encode_document(data.corpus_texts)
    report("corpus", len(data.corpus_texts), len(data.corpus_texts))
    queries = view.encode_query(data.query_texts)
    if kind == "sparse":
        return sparse_exact_run(data.query_ids, queries, data.corpus_ids, documents, depth)
    return multivector_exact_run(data.query_ids, queries, data.corpus_ids, documents, depth)


def bm25_run(
    query_ids: Sequence[str],
    query_texts: list[str],
    corpus_ids: Sequence[str],
    corpus_texts: list[str],
    depth: int,
    options: Any = None,
) -> Run:
    """bm25s in memory with the index's tokenisation, parameters (BM25Options) and cut: each
    query's scores over every document, its best ``depth`` of those sharing a word with it
    (:func:`~clearformer.index.kind_index.top_k`), as ``BM25Index`` searches. bm25s's own
    ``retrieve`` would fill the depth with documents scoring 0, in an order of its own."""
    import bm25s

    from ..index.bm25_index import BM25Options, query_terms, tokenize

    options = BM25Options() if options is None else options
    retriever = bm25s.BM25(k1=options.k1, b=options.b, method=options.method)
    retriever.index(tokenize(corpus_texts, options), show_progress=False)
    zeros = np.zeros(len(corpus_texts))
    scores = [
        retriever.get_scores(terms) if terms else zeros
        for terms in query_terms(query_texts, options)
    ]  # (Q, n) rows
    return _top_run(query_ids, corpus_ids, np.asarray(scores), depth)


def sparse_exact_run(query_ids, queries, corpus_ids, documents, depth: int) -> Run:
    """Brute force: the (Q, n) product of the sparse query and document matrices."""
    import scipy.sparse

    def csr(batch):
        from ..index.ragged import sparse_rows

        rows = sparse_rows(batch)
        shape = (rows.rows, int(batch.shape[1]))
        return scipy.sparse.csr_matrix((rows.values, rows.indices, rows.indptr), shape=shape)

    scores = (csr(queries) @ csr(documents).T).toarray()  # (Q, n) dot products
    return _top_run(query_ids, corpus_ids, scores, depth)


def multivector_exact_run(query_ids, queries, corpus_ids, documents, depth: int) -> Run:
    """Brute force: MaxSim of every query against every document."""
    from .maxsim import maxsim_scores

    scores = maxsim_scores(list(queries), list(documents)).numpy()  # (Q, n)
    # Every document has a MaxSim (negative too), and MultiVectorIndex ranks them all.
    return _top_run(query_ids, corpus_ids, scores, depth, positive_only=False)


def _top_run(query_ids, corpus_ids, scores: np.ndarray, depth: int, positive_only=True) -> Run:
    from ..index.kind_index import top_k

    run: Run = {}
    for query, row_scores in zip(query_ids, scores, strict=True):
        row_scores = np.asarray(row_scores, dtype=np.float64)
        rows, values = top_k(row_scores, depth, positive_only=positive_only)
        run[query] = {corpus_ids[r]: float(v) for r, v in zip(rows, values, strict=True) if r >= 0}
    return run


def _index_run(kind: str, data, model: Any, settings, depth: int, report) -> Run:
    from ..index import build_index, open_kind_index
    from ..index.collection import kinds_present

    root = Path(settings.index)
    if kind not in kinds_present(root):
        report("corpus", 0, len(data.corpus_texts))
        build_index(root, data.corpus_texts, None if kind == "bm25" else model, kind=kind,
                    ids=data.corpus_ids)  # fmt: skip
        report("corpus", len(data.corpus_texts), len(data.corpus_texts))
    index = open_kind_index(root, kind, None if kind == "bm25" else model)
    if index.rows != len(data.corpus_ids):
        raise ValueError(
            f"index {root} holds {index.rows} rows, the corpus {len(data.corpus_ids)} documents: "
            "it was built from other texts"
        )
    _check_texts_store(root, data)
    hits = index.search(list(data.query_texts), k=depth)
    return {
        q: {h.id: h.score for h in found} for q, found in zip(data.query_ids, hits, strict=True)
    }


def _check_texts_store(root: Path, data) -> None:
    """ValueError unless the folder's texts store holds ``data``'s corpus: the same ids may
    name other texts (the corpus edited since the build), whose kinds would then be scored
    against these qrels in silence."""
    from ..index.collection import holds_state, open_texts
    from ..index.texts_record import content_hash

    _, record = open_texts(root)
    content = content_hash(data.corpus_texts, data.corpus_ids)
    if not holds_state(record, len(data.corpus_ids), content):
        raise ValueError(
            f"index {root} was built from other texts: it holds {record['rows']} rows of "
            f"content {record['content'][:12]}, the corpus {len(data.corpus_ids)} of content "
            f"{content[:12]}; give another --index path to build one"
        )


def fused_run(runs: Mapping[str, Run], fusion, depth: int) -> Run:
    """Each query's rankings (one per kind) fused on document ids."""
    from .metrics import ranked

    out: Run = {}
    for query in next(iter(runs.values())):
        rankings = {
            kind: [(doc, run[query][doc]) for doc in ranked(run.get(query, {}))]
            for kind, run in runs.items()
        }
        out[query] = dict(fusion.fuse(rankings, depth))
    return out
