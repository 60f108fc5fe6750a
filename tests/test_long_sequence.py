"""Long sequences: with no weights requested, attention memory stays linear in T.

Peak memory is measured in a fresh process (see :mod:`clearformer.bench.memory`): the rise of
the resident-set high-water mark during one forward of one layer. A (T, T) score matrix per
head at T = 2048 is H * T * T * 4 bytes = 192 MiB; the fused path must stay far below it, and
the math path, which does materialise it, must exceed it (so the probe can see the difference).
"""

from __future__ import annotations

import pytest
import torch

from clearformer import MultiHeadAttention
from clearformer.bench.memory import measure

T, H = 2048, 12
SCORES_BYTES = H * T * T * 4


@pytest.fixture(scope="module")
def probes() -> dict[str, int]:
    return {
        impl: measure(impl, "minilm", T, threads=1)["peak_extra_bytes"]
        for impl in ("clearformer auto", "clearformer math")
    }


def test_fused_layer_memory_is_far_below_one_score_matrix(probes):
    assert probes["clearformer auto"] < SCORES_BYTES / 2, probes


def test_probe_sees_the_quadratic_path(probes):
    assert probes["clearformer math"] > SCORES_BYTES, probes
    assert probes["clearformer math"] > 4 * probes["clearformer auto"], probes


def test_long_sequence_sdpa_matches_math_rows():
    # Correctness at a length where the score matrix is large: compare a few query rows.
    attn = MultiHeadAttention(64, 64, 64, 64, 4).eval()
    x = torch.randn(1, 1024, 64)
    with torch.no_grad():
        got, _ = attn(x)
        want, _ = attn(x, backend="math")
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
