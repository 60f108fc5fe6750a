"""MUVERA's fixed-dimensional encodings: the definition written out with loops, and the
defining property (their dot product follows MaxSim; recall of the exact MaxSim top 10
among the candidates rises with their number)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from clearformer.index.muvera import Muvera, MuveraConfig
from clearformer.index.ragged import token_rows
from clearformer.retrieval.maxsim import maxsim_scores

from .hybrid_helpers import clustered_tokens


def reference_encoding(muvera: Muvera, tokens: np.ndarray, document: bool) -> np.ndarray:
    """The paper's definition, one repetition and one partition at a time."""
    c = muvera.config
    planes, projections, final = muvera._matrices
    blocks = []
    for plane, projection in zip(planes, projections, strict=True):
        bits = (tokens @ plane > 0).astype(int)  # (T, bits)
        number = bits @ (1 << np.arange(c.simhash_bits))
        projected = tokens if projection is None else tokens @ projection
        for p in range(c.partitions):
            members = projected[number == p]
            if len(members):
                blocks.append(members.mean(0) if document else members.sum(0))
            elif document and len(tokens):
                code = (p >> np.arange(c.simhash_bits)) & 1
                blocks.append(projected[np.argmin((bits != code).sum(1))])
            else:
                blocks.append(np.zeros(c.block, np.float32))
    encoded = np.concatenate(blocks)
    return encoded if final is None else encoded @ final


@pytest.mark.parametrize(
    "config",
    [
        MuveraConfig(dim=8, repetitions=3, simhash_bits=3, projection=None),
        MuveraConfig(dim=8, repetitions=2, simhash_bits=2, projection=4, final_dimensions=16),
    ],
)
def test_encoding_is_the_definition(config):
    rng = np.random.default_rng(1)
    sets = [rng.standard_normal((t, 8)).astype(np.float32) for t in (1, 2, 5, 9)]
    muvera = Muvera(config)
    queries = muvera.encode_queries(token_rows(sets))
    documents = muvera.encode_documents(token_rows(sets))
    assert documents.shape == (4, config.dimensions)
    for i, tokens in enumerate(sets):
        np.testing.assert_allclose(queries[i], reference_encoding(muvera, tokens, False), atol=1e-5)
        np.testing.assert_allclose(
            documents[i], reference_encoding(muvera, tokens, True), atol=1e-5
        )
    # the empty-partition filling is on (a 1-token document fills every partition) ...
    assert np.count_nonzero(np.abs(documents[0]).reshape(-1, config.block).sum(1)) > 3


def test_one_partition_gives_sum_dot_mean():
    """With no hyperplane cut (0 would be invalid; one cut with every token on one side):
    FDE(q) . FDE(d) = sum(q) . mean(d), the formula's simplest case."""
    muvera = Muvera(MuveraConfig(dim=4, repetitions=1, simhash_bits=1, projection=None))
    plane = muvera._matrices[0][0][:, 0]
    side = plane / np.linalg.norm(plane)  # every token has a positive dot with the plane
    q = (side + 0.01 * np.eye(4)[:2]).astype(np.float32)
    d = (side + 0.01 * np.eye(4)[1:4]).astype(np.float32)
    got = muvera.encode_queries(token_rows([q])) @ muvera.encode_documents(token_rows([d])).T
    assert got[0, 0] == pytest.approx(float(q.sum(0) @ d.mean(0)), rel=1e-5)


def test_dot_product_follows_maxsim_and_recall_rises_with_candidates():
    documents, queries = clustered_tokens(600, seed=3)
    exact = maxsim_scores(
        [torch.from_numpy(q) for q in queries], [torch.from_numpy(d) for d in documents]
    ).numpy()  # (40, 600)
    muvera = Muvera(MuveraConfig(dim=32, repetitions=20, simhash_bits=4, projection=None))
    approx = (
        muvera.encode_queries(token_rows(queries))
        @ muvera.encode_documents(token_rows(documents)).T
    )
    assert np.corrcoef(approx.ravel(), exact.ravel())[0, 1] > 0.6
    shuffled = np.random.default_rng(0).permutation(approx.ravel())
    assert abs(np.corrcoef(shuffled, exact.ravel())[0, 1]) < 0.1  # negative control
    true = np.argsort(-exact, axis=1)[:, :10]

    def recall(scores, count):
        found = np.argsort(-scores, axis=1)[:, :count]
        return np.mean([len(set(t) & set(f)) / 10 for t, f in zip(true, found, strict=True)])

    recalls = [recall(approx, c) for c in (10, 50, 100, 200)]
    assert recalls == sorted(recalls) and recalls[-1] > recalls[0] + 0.3
    assert recalls[-1] >= 0.9  # the stated bound: 200 candidates of 600 (measured 0.96)
    noise = np.random.default_rng(1).standard_normal(approx.shape)
    assert recall(noise, 200) < 0.5  # negative control: random candidates (200/600 expected)


def test_config_checks():
    with pytest.raises(ValueError, match="simhash_bits must be"):
        MuveraConfig(dim=8, simhash_bits=0)
    with pytest.raises(ValueError, match="token vectors must be"):
        Muvera(MuveraConfig(dim=8)).encode_queries(token_rows([np.zeros((2, 4), np.float32)]))
