"""Two evaluations of one benchmark, compared per measure with a paired bootstrap interval.

Both results scored the same queries, so the difference is taken query by query (paired):
the queries are drawn with replacement ``rounds`` times, the mean difference computed on each
draw, and the 2.5th and 97.5th percentiles of those means are the 95 % interval. An interval
that excludes zero says the difference is larger than the choice of queries explains.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

BOOTSTRAP_ROUNDS = 10_000
BOOTSTRAP_SEED = 0  # the same draws every time: a comparison printed twice is the same


@dataclass(frozen=True)
class Difference:
    """One measure: this result's mean, the other's, their difference and its 95 % interval."""

    measure: str
    this: float
    other: float
    delta: float
    low: float
    high: float

    @property
    def significant(self) -> bool:
        return self.low > 0 or self.high < 0


def compare(
    this: Mapping[str, Mapping[str, float]],
    other: Mapping[str, Mapping[str, float]],
    rounds: int = BOOTSTRAP_ROUNDS,
    seed: int = BOOTSTRAP_SEED,
) -> list[Difference]:
    """Per-measure differences of two per-query results (query -> measure -> value).

    Raises:
        ValueError: the two do not score the same queries or measures.
    """
    if set(this) != set(other):
        only = sorted(set(this) ^ set(other))
        raise ValueError(
            f"the two results score different queries ({len(this)} and {len(other)}; "
            f"{len(only)} in one only, e.g. {only[0]!r}): compare evaluations of the same split"
        )
    if not this:
        raise ValueError("the results score no query")
    queries = sorted(this)
    # The measures both give for every query (in this result's order).
    measures = [
        m for m in next(iter(this.values())) if all(m in this[q] and m in other[q] for q in queries)
    ]
    if not measures:
        raise ValueError("the two results share no measure")
    draws = np.random.default_rng(seed).integers(0, len(queries), (rounds, len(queries)))
    out = []
    for measure in measures:
        a = np.array([this[q][measure] for q in queries], dtype=np.float64)  # (Q,)
        b = np.array([other[q][measure] for q in queries], dtype=np.float64)  # (Q,)
        means = (a - b)[draws].mean(axis=1)  # (rounds,) mean difference of each draw
        low, high = np.percentile(means, [2.5, 97.5])
        out.append(Difference(measure, a.mean(), b.mean(), (a - b).mean(), float(low), float(high)))
    return out
