"""Two routes of the same whole ``encode`` calls timed side by side in one process, for the
benchmarks that weigh one implementation against another (``int8_routes.py``,
``mkl_linear_route.py``): each route warmed up once, then the routes in turns, round by round,
the order alternating so that neither always runs first; best of the rounds, each round's
ratio, and the min cosine between the routes' embeddings."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def compare_routes(
    encode: Callable[[str], tuple[float, np.ndarray]], candidate: str, baseline: str, rounds: int
) -> None:
    """Time ``encode(route)`` (seconds, embeddings) for ``candidate`` and ``baseline`` and
    print the comparison: > 1 means ``candidate`` is faster."""
    routes = [candidate, baseline]
    vectors = {route: encode(route)[1] for route in routes}  # warm-up (compiles, packing)
    times: dict[str, list[float]] = {route: [] for route in routes}
    for r in range(rounds):
        for route in routes if r % 2 == 0 else routes[::-1]:
            times[route].append(encode(route)[0])
    best = {route: min(t) for route, t in times.items()}
    for route, seconds in best.items():
        print(f"  {route}: {seconds:.3f} s (best of {rounds})")
    print(f"  speed-up of {candidate}: {best[baseline] / best[candidate]:.3f}x")
    ratios = [b / c for c, b in zip(times[candidate], times[baseline], strict=True)]
    print("  each round: " + ", ".join(f"{r:.2f}" for r in ratios))
    cosine = (vectors[candidate] * vectors[baseline]).sum(1)
    print(f"  min cosine between the routes' embeddings: {cosine.min():.7f}")
