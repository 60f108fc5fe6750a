"""MaxSim: the late-interaction score of ColBERT.

A query and a document are each a matrix of token vectors. For every query token, take its best
dot product over the document's tokens; the score is the sum of those maxima. It rewards a
document for matching every part of the query somewhere, which one pooled vector cannot express.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def maxsim(query: Tensor, document: Tensor) -> Tensor:
    """The MaxSim score of one query against one document.

    Args:
        query: ``(Tq, D)`` token vectors.
        document: ``(Td, D)`` token vectors.

    Returns:
        A 0-d tensor: ``sum_i max_j query[i] . document[j]``; ``0`` for an empty document.
    """
    _check_pair(query, document)
    if document.shape[0] == 0 or query.shape[0] == 0:
        return query.new_zeros(())
    similarity = query @ document.T  # (Tq, Td)
    return similarity.max(dim=1).values.sum()


def maxsim_scores(queries: Sequence[Tensor], documents: Sequence[Tensor]) -> Tensor:
    """MaxSim of every query against every document.

    Args:
        queries: Q tensors of shape ``(Tq_i, D)``.
        documents: N tensors of shape ``(Td_j, D)``.

    Returns:
        ``(Q, N)`` scores in the queries' dtype.
    """
    if not queries or not documents:
        return torch.zeros(len(queries), len(documents))
    for document in documents:
        _check_pair(queries[0], document)
    # All documents' tokens in one matrix, so each query is one matrix product, not N.
    lengths = [document.shape[0] for document in documents]
    tokens = torch.cat(list(documents), dim=0)  # (sum Td, D)
    owner = torch.repeat_interleave(
        torch.arange(len(documents)), torch.tensor(lengths)
    )  # (sum Td,)
    scores = queries[0].new_zeros(len(queries), len(documents))
    for row, query in enumerate(queries):
        _check_pair(query, documents[0])
        similarity = query @ tokens.T  # (Tq, sum Td)
        # Best document token per (query token, document): a scatter-max over each document's span.
        best = similarity.new_full((query.shape[0], len(documents)), float("-inf"))
        best = best.scatter_reduce(1, owner.expand(query.shape[0], -1), similarity, reduce="amax")
        best = best.masked_fill(torch.isinf(best), 0.0)  # empty documents score 0
        scores[row] = best.sum(dim=0)
    return scores


def _check_pair(query: Tensor, document: Tensor) -> None:
    for name, value in (("query", query), ("document", document)):
        if not isinstance(value, Tensor):
            raise TypeError(
                f"maxsim: each {name} must be a (tokens, dim) tensor, got {type(value).__name__}"
            )
    if query.dim() != 2 or document.dim() != 2:
        raise ValueError(
            f"maxsim: expected (tokens, dim) matrices, got query {tuple(query.shape)} "
            f"and document {tuple(document.shape)}"
        )
    if query.shape[1] != document.shape[1]:
        raise ValueError(
            f"maxsim: query and document widths differ: {query.shape[1]} vs {document.shape[1]}"
        )
    if query.dtype != document.dtype:
        raise TypeError(
            f"maxsim: query and document dtypes differ: {query.dtype} vs {document.dtype}; "
            "cast one (the scores are in the queries' dtype)"
        )
