"""MaxSim against its definition written as loops, and its batched form against the pairwise one."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from clearformer.retrieval.maxsim import maxsim, maxsim_scores


def _loops(query, document):
    total = 0.0
    for q in query:
        total += max(float(q @ d) for d in document) if len(document) else 0.0
    return total


@settings(max_examples=40, deadline=None)
@given(
    query_lengths=st.lists(st.integers(1, 6), min_size=1, max_size=3),
    document_lengths=st.lists(st.integers(0, 7), min_size=1, max_size=4),
    seed=st.integers(0, 1000),
)
def test_scores_equal_the_definition(query_lengths, document_lengths, seed):
    generator = torch.Generator().manual_seed(seed)
    queries = [torch.randn(n, 5, generator=generator, dtype=torch.float64) for n in query_lengths]
    documents = [
        torch.randn(n, 5, generator=generator, dtype=torch.float64) for n in document_lengths
    ]
    scores = maxsim_scores(queries, documents)
    assert scores.shape == (len(queries), len(documents))
    for i, query in enumerate(queries):
        for j, document in enumerate(documents):
            expected = _loops(query, document)
            assert float(maxsim(query, document)) == pytest.approx(expected, abs=1e-12)
            assert float(scores[i, j]) == pytest.approx(expected, abs=1e-12)


def test_negative_similarities_are_not_clipped():
    query = torch.tensor([[1.0, 0.0]])
    document = torch.tensor([[-1.0, 0.0], [-0.5, 0.0]])
    assert float(maxsim(query, document)) == -0.5
    assert float(maxsim_scores([query], [document])[0, 0]) == -0.5


def test_width_mismatch_is_named():
    with pytest.raises(ValueError, match="widths differ: 2 vs 3"):
        maxsim(torch.zeros(1, 2), torch.zeros(1, 3))
