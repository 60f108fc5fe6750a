"""The in-batch negatives loss of retrieval training (sentence-transformers'
``MultipleNegativesRankingLoss``), its symmetric form, and Matryoshka widths.

For a batch of B anchors, the candidates are every positive of the batch and every hard
negative: C = B + (negatives) rows, the first B the positives in the anchors' order. Anchor i
should pick candidate i among all C. With cosine similarities times ``scale`` as logits, that
is a cross-entropy over C classes per anchor, averaged over the anchors::

    loss = mean_i [ -log softmax_j(scale * cos(a_i, c_j))[i] ]

Every other anchor's positive is a negative for free ("in-batch negatives"), so a larger
batch gives more negatives at no extra cost in data; GradCache (:mod:`.gradcache`) makes a large
batch fit in memory. The scale of 20 (a temperature of 0.05) is sentence-transformers'
default.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

DEFAULT_SCALE = 20.0


def multiple_negatives_loss(
    anchors: Tensor, candidates: Tensor, *, scale: float = DEFAULT_SCALE, symmetric: bool = False
) -> Tensor:
    """The mean cross-entropy of each anchor picking its own positive.

    Args:
        anchors: (B, d) embeddings.
        candidates: (C, d), C >= B: the B positives in the anchors' order, then any negatives.
        symmetric: also each positive picking its anchor among the B anchors, and the two
            losses averaged (sentence-transformers' ``MultipleNegativesSymmetricRankingLoss``).

    Returns:
        a scalar.
    """
    B = anchors.shape[0]
    if candidates.shape[0] < B:
        raise ValueError(
            f"candidates must start with the {B} positives, got {candidates.shape[0]} rows"
        )
    scores = F.normalize(anchors, dim=-1) @ F.normalize(candidates, dim=-1).T * scale  # (B, C)
    labels = torch.arange(B, device=anchors.device)
    loss = F.cross_entropy(scores, labels)
    if symmetric:
        loss = (loss + F.cross_entropy(scores[:, :B].T, labels)) / 2  # (B, B): positives -> anchors
    return loss


def matryoshka_loss(
    anchors: Tensor,
    candidates: Tensor,
    dimensions: Sequence[int],
    weights: Sequence[float] | None = None,
    **loss_options,
) -> Tensor:
    """The loss summed over widths: each the first ``d`` values of every embedding
    (sentence-transformers' ``MatryoshkaLoss``, every width at every step, weights 1 by default),
    so that the embedding cut to any of ``dimensions`` still retrieves."""
    weights = [1.0] * len(dimensions) if weights is None else list(weights)
    total = anchors.new_zeros(())
    for d, weight in zip(dimensions, weights, strict=True):
        total = total + weight * multiple_negatives_loss(
            anchors[:, :d], candidates[:, :d], **loss_options
        )
    return total
