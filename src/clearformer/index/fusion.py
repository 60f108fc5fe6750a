"""Fusion: one ranking from the rankings of several kinds of index (dense, sparse,
multi-vector, BM25).

* **RRF**, reciprocal rank fusion (Cormack, Clarke and Büttcher 2009):
  ``score(d) = sum over rankings r that hold d of 1 / (k + rank_r(d))``, ranks from 1,
  ``k = 60`` by default. It reads ranks only, so scores of different scales (a cosine, a BM25
  sum) need no calibration; ``k`` damps the weight of the very first ranks.
* **Weighted** score fusion: ``score(d) = sum_r w_r * norm_r(s_r(d))``, each ranking's scores
  normalised over its own returned list first, because a BM25 score of 20 and a cosine of 0.8
  are not on one scale:

  - ``minmax``: ``(s - min) / (max - min)`` (1 for every document when all scores are equal);
  - ``zscore``: ``(s - mean) / std`` (0 when all are equal; population std).

  A document missing from a ranking gets nothing from it (RRF) or that ranking's lowest
  normalised value (weighted: 0 for minmax, the lowest z-score for zscore): it was not found
  there, so it counts as no better than the worst one that was.

Ties are broken by the document's first appearance (ranking order, then rank), so the result
is deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

METHODS = ("rrf", "weighted")
NORMALIZATIONS = ("minmax", "zscore")

Ranking = Sequence[tuple[int, float]]  # (document row, score), best first


@dataclass(frozen=True)
class Fusion:
    """How the rankings of several kinds become one."""

    method: str = "rrf"  # rrf | weighted
    k: int = 60  # RRF's constant (the paper's 60)
    weights: Mapping[str, float] = field(default_factory=dict)  # weighted: per kind, default 1
    normalization: str = "minmax"  # weighted: minmax | zscore

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"fusion must be one of {METHODS}, got {self.method!r}")
        if self.normalization not in NORMALIZATIONS:
            raise ValueError(
                f"normalization must be one of {NORMALIZATIONS}, got {self.normalization!r}"
            )
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 0:
            raise ValueError(f"k must be an integer >= 0, got {self.k!r}")
        for kind, weight in self.weights.items():
            real = isinstance(weight, int | float | np.integer | np.floating)
            if not real or isinstance(weight, bool) or not np.isfinite(weight) or weight < 0:
                raise ValueError(f"weight of {kind} must be a finite number >= 0, got {weight!r}")

    def fuse(self, rankings: Mapping[str, Ranking], top: int) -> list[tuple[int, float]]:
        """The ``top`` best documents over ``rankings`` (kind -> ranking), best first."""
        if self.method == "rrf":
            return reciprocal_rank_fusion(list(rankings.values()), self.k, top)
        weights = [float(self.weights.get(kind, 1.0)) for kind in rankings]
        return weighted_fusion(list(rankings.values()), weights, self.normalization, top)


def reciprocal_rank_fusion(
    rankings: Sequence[Ranking], k: int, top: int
) -> list[tuple[int, float]]:
    """RRF over ``rankings``: ``sum_r 1 / (k + rank)``, ranks from 1."""
    terms: dict[int, list[float]] = {}
    for ranking in rankings:
        for rank, (row, _) in enumerate(ranking, start=1):
            terms.setdefault(row, []).append(1.0 / (k + rank))
    # fsum rounds the exact sum once, so documents at the same ranks in other rankings tie
    # exactly (a running sum depends on the order of its terms in the last bit), and the tie
    # goes to the first appearance, as documented.
    scores = {row: math.fsum(values) for row, values in terms.items()}
    return _best(scores, top)


def weighted_fusion(
    rankings: Sequence[Ranking], weights: Sequence[float], normalization: str, top: int
) -> list[tuple[int, float]]:
    """``sum_r w_r * norm_r(s)`` with ``normalization`` minmax or zscore per ranking."""
    normalised = [_normalise(ranking, normalization) for ranking in rankings]
    everyone = {row for ranking in rankings for row, _ in ranking}
    scores: dict[int, float] = {}
    for ranking in rankings:  # first-appearance order, for ties
        for row, _ in ranking:
            scores.setdefault(row, 0.0)
    for (values, floor), weight in zip(normalised, weights, strict=True):
        for row in everyone:
            scores[row] += weight * values.get(row, floor)
    return _best(scores, top)


def _normalise(ranking: Ranking, normalization: str) -> tuple[dict[int, float], float]:
    """(row -> normalised score, the value of a row the ranking lacks)."""
    if not ranking:
        return {}, 0.0
    scores = np.array([score for _, score in ranking], dtype=np.float64)  # (n,)
    if normalization == "minmax":
        low, high = scores.min(), scores.max()
        spread = high - low
        values = np.ones_like(scores) if spread == 0 else (scores - low) / spread
        floor = 0.0
    else:
        std = scores.std()
        values = np.zeros_like(scores) if std == 0 else (scores - scores.mean()) / std
        floor = float(values.min())
    return {row: float(v) for (row, _), v in zip(ranking, values, strict=True)}, floor


def _best(scores: dict[int, float], top: int) -> list[tuple[int, float]]:
    # sorted() is stable: equal scores keep first-appearance order (dict insertion order).
    return sorted(scores.items(), key=lambda item: -item[1])[:top]
