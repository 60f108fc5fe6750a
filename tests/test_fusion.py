"""Fusion formulas against examples computed by hand."""

from __future__ import annotations

import pytest

from clearformer.index.fusion import Fusion, reciprocal_rank_fusion, weighted_fusion


def test_rrf_matches_the_formula_written_out():
    dense = [(7, 0.9), (3, 0.8), (5, 0.1)]
    bm25 = [(3, 12.0), (9, 11.0)]
    fused = dict(reciprocal_rank_fusion([dense, bm25], k=60, top=10))
    assert fused[3] == pytest.approx(1 / 62 + 1 / 61)
    assert fused[7] == pytest.approx(1 / 61)
    assert fused[9] == pytest.approx(1 / 62)
    assert fused[5] == pytest.approx(1 / 63)
    order = [row for row, _ in reciprocal_rank_fusion([dense, bm25], k=60, top=10)]
    assert order == [3, 7, 9, 5]  # 1/61 > 1/62: 7 before 9


def test_rrf_reads_ranks_not_scores():
    a = reciprocal_rank_fusion([[(1, 1000.0), (2, 999.0)]], k=60, top=2)
    b = reciprocal_rank_fusion([[(1, 0.2), (2, 0.1)]], k=60, top=2)
    assert a == b


def test_rrf_ties_keep_first_appearance_and_k_changes_scores():
    fused = reciprocal_rank_fusion([[(4, 1.0)], [(2, 1.0)]], k=0, top=2)
    assert fused == [(4, 1.0), (2, 1.0)]
    assert reciprocal_rank_fusion([[(4, 1.0)]], k=10, top=1) == [(4, pytest.approx(1 / 11))]


def _ranking(at: dict[int, int], length: int = 7, filler: int = 100) -> list[tuple[int, float]]:
    """A ranking of ``length`` rows with row r at rank ``at[r]`` (from 1), others filling in."""
    rows = [filler + rank for rank in range(1, length + 1)]
    for row, rank in at.items():
        rows[rank - 1] = row
    return [(row, 1.0 / rank) for rank, row in enumerate(rows, start=1)]


@pytest.mark.parametrize("first", [1, 2])
def test_rrf_ties_of_three_rankings_do_not_depend_on_summation_order(first):
    """Row 1 at ranks (1, 7, 2) and row 2 at (2, 1, 7): the same three terms, so the same
    score (a running sum gives them sums that differ in the last bit), and the tie goes to the
    row that appears first."""
    second = 3 - first
    rankings = [
        _ranking({first: 1, second: 2}, filler=100),
        _ranking({second: 1, first: 7}, filler=200),
        _ranking({first: 2, second: 7}, filler=300),
    ]
    fused = reciprocal_rank_fusion(rankings, k=60, top=3)
    assert [row for row, _ in fused[:2]] == [first, second]
    assert fused[0][1] == fused[1][1] == pytest.approx(1 / 61 + 1 / 62 + 1 / 67)


def test_weighted_minmax_by_hand():
    dense = [(1, 0.9), (2, 0.5), (3, 0.1)]  # minmax: 1, 0.5, 0
    bm25 = [(2, 20.0), (4, 10.0)]  # minmax: 1, 0
    fused = dict(weighted_fusion([dense, bm25], [2.0, 1.0], "minmax", top=10))
    assert fused[1] == pytest.approx(2 * 1.0 + 0.0)  # missing from bm25: 0
    assert fused[2] == pytest.approx(2 * 0.5 + 1.0)
    assert fused[3] == pytest.approx(0.0)
    assert fused[4] == pytest.approx(0.0 + 0.0)


def test_weighted_zscore_by_hand():
    dense = [(1, 3.0), (2, 1.0)]  # mean 2, std 1: z = 1, -1
    bm25 = [(2, 5.0), (3, 2.0), (4, 2.0)]  # mean 3, std sqrt(2): z = 1.414, -0.707, -0.707
    fused = dict(weighted_fusion([dense, bm25], [1.0, 0.5], "zscore", top=10))
    s = 2**0.5
    assert fused[1] == pytest.approx(1.0 + 0.5 * (-1 / s))  # missing: bm25's lowest z
    assert fused[2] == pytest.approx(-1.0 + 0.5 * s)
    assert fused[3] == pytest.approx(-1.0 + 0.5 * (-1 / s))


def test_equal_scores_normalise_without_dividing_by_zero():
    fused = weighted_fusion([[(1, 5.0), (2, 5.0)]], [1.0], "minmax", top=2)
    assert fused == [(1, 1.0), (2, 1.0)]
    fused = weighted_fusion([[(1, 5.0), (2, 5.0)]], [1.0], "zscore", top=2)
    assert fused == [(1, 0.0), (2, 0.0)]


def test_fusion_config_uses_weights_by_kind_and_checks_its_fields():
    rankings = {"dense": [(1, 1.0), (2, 0.0)], "bm25": [(2, 1.0), (1, 0.0)]}
    assert Fusion("weighted", weights={"bm25": 3.0}).fuse(rankings, 1) == [(2, 3.0)]
    assert Fusion("weighted", weights={"dense": 3.0}).fuse(rankings, 1) == [(1, 3.0)]
    with pytest.raises(ValueError, match="fusion must be one of"):
        Fusion("sum")
    with pytest.raises(ValueError, match="normalization must be one of"):
        Fusion("weighted", normalization="softmax")
    with pytest.raises(ValueError, match="weight of bm25"):
        Fusion("weighted", weights={"bm25": -1.0})
    for weight in ("1", None, True, [1.0]):  # not numbers: a ValueError naming the kind
        with pytest.raises(ValueError, match=r"weight of bm25 must be a finite number >= 0"):
            Fusion("weighted", weights={"bm25": weight})
