"""A ``clearformer index build`` or ``add`` killed with SIGKILL -- while embedding, before its
commit, or after it -- leaves the previous index whole and current; the same command again
resumes from the chunks of embeddings it committed and ends as an uninterrupted run does,
with every text in the index exactly once."""

from __future__ import annotations

import shutil
import signal

import numpy as np
import pytest

from clearformer.index import VectorIndex

from .index_helpers import cli, killed_cli, tiny_model, word_texts

pytest.importorskip("usearch")

CHUNK = "clearformer.index.chunks:ChunkStore.write"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("kill")
    model = tiny_model(root / "model")
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(word_texts(200)) + "\n", encoding="utf-8")
    more = root / "more.txt"
    more.write_text("\n".join(word_texts(60, seed=5)) + "\n", encoding="utf-8")
    built, whole = root / "built", root / "whole"
    flags = ("--model", str(model), "--chunk-rows", "32", "--ann", "hnsw", "--storage", "int8")
    result = cli("index", "build", "--corpus", str(corpus), "--out", str(built), *flags)
    assert result.returncode == 0, result.stderr
    shutil.copytree(built, whole)
    result = cli("index", "add", str(whole), "--corpus", str(more))
    assert result.returncode == 0, result.stderr
    return built, corpus, more, flags, whole


def same_index(a, b) -> None:
    a, b = VectorIndex.open(a), VectorIndex.open(b)
    assert a.rows == b.rows
    rows = np.arange(a.rows)
    np.testing.assert_array_equal(a.vectors(rows), b.vectors(rows))
    texts = lambda index: [(h.id, h.text) for h in index.hits(rows[None], rows[None] * 0.0)[0]]  # noqa: E731
    assert texts(a) == texts(b)


def test_build_killed_while_embedding_resumes_from_its_chunks(tmp_path, setup):
    _, corpus, more, flags, whole = setup
    out = tmp_path / "idx"
    build = ("index", "build", "--corpus", str(corpus), "--out", str(out), *flags)
    killed = killed_cli(f"{CHUNK}:4", *build)  # three of seven chunks committed
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not (out / "CURRENT").exists()  # nothing committed: no index to read
    with pytest.raises(FileNotFoundError, match="run the same build again to resume"):
        VectorIndex.open(out)
    result = cli(*build)
    assert result.returncode == 0, result.stderr
    assert "4 chunk(s) encoded, 3 chunk(s) reused" in result.stderr
    assert not (out / "staging").exists() or not any((out / "staging").iterdir())
    result = cli("index", "add", str(out), "--corpus", str(more))
    assert result.returncode == 0, result.stderr
    same_index(out, whole)


@pytest.mark.parametrize(
    "stage",
    ["clearformer.index.engine:save_graph:1", "clearformer.index.layout:commit:1"],
)
def test_add_killed_before_its_commit_leaves_the_previous_index(tmp_path, setup, stage):
    built, _, more, _, whole = setup
    out = tmp_path / "idx"
    shutil.copytree(built, out)
    killed = killed_cli(stage, "index", "add", str(out), "--corpus", str(more))
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    index = VectorIndex.open(out)  # the previous generation, whole
    assert (index.generation, index.rows) == ("gen-000001", 200)
    rows, _ = index.search_vectors(index.vectors(np.arange(3)), k=3)
    assert (rows >= 0).all()
    result = cli("index", "add", str(out), "--corpus", str(more))
    assert result.returncode == 0, result.stderr
    assert "chunk(s) reused" in result.stderr  # the embeddings were committed before the kill
    same_index(out, whole)
    # The committed generation before this add is kept for readers; the killed one is gone.
    kept = sorted(p.name for p in (out / "generations").iterdir())
    assert kept in (["gen-000001", "gen-000002"], ["gen-000001", "gen-000003"])


def test_add_killed_after_its_commit_is_not_added_twice(tmp_path, setup):
    built, _, more, _, whole = setup
    out = tmp_path / "idx"
    shutil.copytree(built, out)
    stage = "clearformer.index.layout:remove_stale:1"
    killed = killed_cli(stage, "index", "add", str(out), "--corpus", str(more))
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert VectorIndex.open(out).rows == 260  # committed before the kill
    result = cli("index", "add", str(out), "--corpus", str(more))
    assert result.returncode == 0 and "already holds these texts" in result.stderr
    same_index(out, whole)
    assert not list((out / "generations").glob(".*"))  # the leftovers were cleaned up
