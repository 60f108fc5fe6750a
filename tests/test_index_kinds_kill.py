"""A sparse build killed with SIGKILL -- while encoding, before its commit -- leaves the
previous generation (if any) whole and current; the same build again resumes from the chunks
it committed and ends as an uninterrupted build does."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from clearformer.index import SparseIndex, SparseOptions, build_index, layout

from .hybrid_helpers import FakeSparseEncoder, word_corpus
from .index_helpers import DIE_ON_CALL, env

ROOT = Path(__file__).resolve().parents[1]
CHUNK_ROWS = 32
TEXTS = word_corpus(200, seed=4)  # 7 chunks of 32

# Build a sparse index with the fake encoder of seed argv[2], SIGKILLed on the argv[4]th call
# of argv[3] ("module:attribute").
SCRIPT = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
from tests.hybrid_helpers import FakeSparseEncoder, word_corpus
from clearformer.index import SparseOptions, build_index
out, seed, target, count = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
{DIE_ON_CALL}
build_index(out, word_corpus(200, seed=4), FakeSparseEncoder(seed=seed), kind="sparse",
            options=SparseOptions(chunk_rows={CHUNK_ROWS}))
"""


def killed(out: Path, target: str, count: int, seed: int = 0) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, str(out), str(seed), target, str(count)],
        env=env(), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def build(out: Path, seed: int = 0) -> tuple[SparseIndex, FakeSparseEncoder]:
    encoder = FakeSparseEncoder(seed=seed)
    index = build_index(
        out, TEXTS, encoder, kind="sparse", options=SparseOptions(chunk_rows=CHUNK_ROWS)
    )
    return index, encoder


def postings(index: SparseIndex) -> list[np.ndarray]:
    return [np.asarray(index._indptr), np.asarray(index._rows), np.asarray(index._weights)]


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    return build(tmp_path_factory.mktemp("whole") / "idx")[0]


def test_killed_while_encoding_resumes_from_its_chunks(tmp_path, whole):
    out = tmp_path / "idx"
    result = killed(out, "clearformer.index.ragged:RaggedChunkStore.write", 4)
    assert result.returncode == -signal.SIGKILL, result.stderr
    assert not (out / "sparse" / "CURRENT").exists()  # nothing committed
    with pytest.raises(FileNotFoundError, match="holds no committed sparse index"):
        SparseIndex.open(out)
    staged = list((out / "sparse" / "staging").glob("*/chunk-*.npz"))
    assert len(staged) == 3
    index, encoder = build(out)
    assert encoder.calls == 7 - 3  # only the chunks the killed build had not committed
    for a, b in zip(postings(index), postings(whole), strict=True):
        np.testing.assert_array_equal(a, b)
    assert not list((out / "sparse" / "staging").glob("*/chunk-*"))  # cleaned after commit


def test_killed_before_commit_leaves_the_previous_generation_current(tmp_path, whole):
    out = tmp_path / "idx"
    first, _ = build(out)
    generation = first.generation
    result = killed(out, "clearformer.index.layout:commit", 1, seed=5)  # another model
    assert result.returncode == -signal.SIGKILL, result.stderr
    assert layout.current_generation(out / "sparse") == generation
    index = SparseIndex.open(out, FakeSparseEncoder())
    for a, b in zip(postings(index), postings(whole), strict=True):
        np.testing.assert_array_equal(a, b)
    assert [h.row for h in index.search("w1 w2", k=5)] == [
        h.row for h in whole.with_encoder(FakeSparseEncoder()).search("w1 w2", k=5)
    ]
    rebuilt, encoder = build(out, seed=5)  # resumes: its chunks were all committed
    assert encoder.calls == 0 and rebuilt.generation != generation
    assert rebuilt.identity.revision == "sparse-5"
    assert len(list((out / "sparse" / "generations").glob("gen-*"))) == 2  # current + previous
