"""``clearformer encode --input CORPUS --output DIR``: one shard per process (torchrun), a
manifest with rows, checksums and the model's identity, shards that together equal a
one-process run row for row, and a killed run that resumes without encoding its committed
chunks again (with another number of processes, too)."""

from __future__ import annotations

import json
import signal

import numpy as np
import pytest

from clearformer.index.identity import file_sha256
from clearformer.index.shards import rank_chunks, read_manifest, read_shards

from .index_helpers import cli, killed_cli, tiny_model, torchrun, word_texts


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    model = tiny_model(root / "model")
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(word_texts(300)) + "\n", encoding="utf-8")
    single = root / "single.npy"
    result = cli("encode", "--input", str(corpus), "--output", str(single), "--model", str(model))
    assert result.returncode == 0, result.stderr
    return model, corpus, np.load(single)


def test_rank_shares_are_whole_chunks_in_order():
    for rows, world in [(300, 2), (300, 3), (10, 4), (64, 1)]:
        shares = [rank_chunks(rows, 32, r, world) for r in range(world)]
        assert [c for share in shares for c in share] == list(range((rows + 31) // 32))


def test_one_process_writes_a_shard_and_a_manifest(tmp_path, setup):
    model, corpus, single = setup
    out = tmp_path / "out"
    argv = ("encode", "--input", str(corpus), "--output", str(out), "--model", str(model),
            "--chunk-rows", "64")  # fmt: skip
    result = cli(*argv)
    assert result.returncode == 0, result.stderr
    manifest = read_manifest(out)
    assert (manifest["rows"], manifest["world"], manifest["dimensions"]) == (300, 1, 16)
    (shard,) = manifest["shards"]
    assert shard["sha256"] == file_sha256(out / shard["file"]) and shard["rows"] == [0, 300]
    assert manifest["model"]["revision"] and manifest["model"]["width"] == 16
    np.testing.assert_allclose(read_shards(out), single, atol=1e-6)
    assert not (out / ".chunks").exists()
    again = cli(*argv)
    assert again.returncode == 0 and "nothing to do" in again.stderr


def test_torchrun_shards_equal_one_process_row_for_row(tmp_path, setup):
    pytest.importorskip("pyarrow")
    model, corpus, single = setup
    out = tmp_path / "out"
    result = torchrun(2, "-m", "clearformer", "encode", "--input", str(corpus), "--output",
                      str(out), "--model", str(model), "--chunk-rows", "64",
                      "--shard-format", "parquet")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    manifest = read_manifest(out)
    assert [s["rows"] for s in manifest["shards"]] == [[0, 128], [128, 300]]
    np.testing.assert_allclose(read_shards(out), single, atol=1e-6)
    import pyarrow.parquet as pq

    table = pq.read_table(out / manifest["shards"][1]["file"])
    assert table.column("row").to_pylist()[0] == 128
    assert table.column("text").to_pylist()[0] == word_texts(300)[128]


def test_a_killed_run_resumes_its_chunks_with_another_process_count(tmp_path, setup):
    model, corpus, single = setup
    out = tmp_path / "out"
    argv = ("encode", "--input", str(corpus), "--output", str(out), "--model", str(model),
            "--chunk-rows", "32")  # fmt: skip
    killed = killed_cli("clearformer.index.chunks:ChunkStore.write:6", *argv)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert len(list((out / ".chunks").glob("chunk-*.npy"))) == 5
    assert not (out / "manifest.json").exists()
    result = torchrun(2, "-m", "clearformer", *argv)
    assert result.returncode == 0, result.stderr[-3000:]
    # Rank 0 owns chunks 0-4, all committed before the kill; rank 1 owns 5-9.
    assert "rank 0/2: wrote" in result.stderr and "(0 chunk(s) encoded, 5 reused)" in result.stderr
    assert "(5 chunk(s) encoded)" in result.stderr
    np.testing.assert_allclose(read_shards(out), single, atol=1e-6)
    assert sorted(p.name for p in out.iterdir()) == [
        "manifest.json",
        "shard-00000-of-00002.json",
        "shard-00000-of-00002.npy",
        "shard-00001-of-00002.json",
        "shard-00001-of-00002.npy",
    ]


def test_another_job_in_the_same_directory_is_refused(tmp_path, setup):
    model, corpus, _ = setup
    out = tmp_path / "out"
    assert cli("encode", "--input", str(corpus), "--output", str(out), "--model",
               str(model)).returncode == 0  # fmt: skip
    other = tmp_path / "other.txt"
    other.write_text("w1 w2\nw3\n", encoding="utf-8")
    result = cli("encode", "--input", str(other), "--output", str(out), "--model", str(model))
    assert result.returncode == 2 and "already holds the shards of another run" in result.stderr
    assert json.loads((out / "manifest.json").read_text())["rows"] == 300
