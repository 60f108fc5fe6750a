"""``clearformer encode --output DIR`` (sharded) in a directory that holds other files, the
per-rank progress lines of a run of several processes, and the Ray and Spark adapters' options
checked where they are made.

A run removes only what a run of its own job left: shards and records a record of this job
names, killed writes' temporary files, and ``.chunks`` when its ``job.json`` is this job's.
A user's ``shard-notes.txt``, another job's shard or chunks are kept, and what is removed is
named on stderr."""

from __future__ import annotations

import json

import numpy as np
import pytest

from clearformer.sharded.shards import encode_shard, read_shards
from clearformer.text import TextEncoder

from .index_helpers import tiny_model, word_texts
from .test_encode_shards_faults import CHUNK_ROWS, copy_of, encode

OTHER_JOB = {"texts": "0" * 64, "rows": 3}  # a job record no run of this corpus writes


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("model") / "model")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n".join(word_texts(40)) + "\n", encoding="utf-8")  # 5 chunks
    return path


@pytest.fixture(scope="module")
def finished(model, corpus, tmp_path_factory):
    """A finished one-process run: the shard, its record and the manifest."""
    out = tmp_path_factory.mktemp("finished") / "out"
    result = encode(model, corpus, out, "--chunk-rows", str(CHUNK_ROWS))
    assert result.returncode == 0, result.stderr
    return out


def names(out) -> list[str]:
    return sorted(p.name for p in out.iterdir())


# --- 1: what is not this job's is kept ---------------------------------------------------------


def test_a_users_files_named_like_shards_are_kept(tmp_path, model, corpus):
    out = tmp_path / "mydata"
    out.mkdir()
    (out / "shard-notes.txt").write_text("precious\n")
    (out / "shard-00000-of-00004.parquet").write_text("another job's shard\n")
    (out / "readme.txt").write_text("keep\n")
    result = encode(model, corpus, out, "--chunk-rows", str(CHUNK_ROWS))
    assert result.returncode == 0, result.stderr
    assert (out / "shard-notes.txt").read_text() == "precious\n"
    assert (out / "shard-00000-of-00004.parquet").read_text() == "another job's shard\n"
    assert (out / "readme.txt").read_text() == "keep\n"
    assert "removed" not in result.stderr, result.stderr
    assert read_shards(out).shape == (40, 16)


def test_another_jobs_record_and_shard_of_another_world_size_are_kept(
    tmp_path, model, corpus, finished
):
    out = copy_of(finished, tmp_path)
    record = json.loads((out / "shard-00000-of-00001.json").read_text())
    other = {**record, "job": OTHER_JOB, "world": 2, "file": "shard-00001-of-00002.npy"}
    (out / "shard-00001-of-00002.json").write_text(json.dumps(other))
    (out / "shard-00001-of-00002.npy").write_bytes(b"another job's rows")
    result = encode(model, corpus, out, "--chunk-rows", str(CHUNK_ROWS))
    assert result.returncode == 0, result.stderr
    assert "nothing to do" in result.stderr and "removed" not in result.stderr, result.stderr
    assert (out / "shard-00001-of-00002.npy").read_bytes() == b"another job's rows"
    assert json.loads((out / "shard-00001-of-00002.json").read_text())["job"] == OTHER_JOB


@pytest.mark.parametrize("job", [OTHER_JOB, None], ids=["another job", "no job.json"])
def test_a_chunks_folder_that_is_not_this_jobs_is_kept(tmp_path, model, corpus, finished, job):
    out = copy_of(finished, tmp_path)
    (out / ".chunks").mkdir()
    (out / ".chunks" / "mine.txt").write_text("precious\n")
    if job is not None:
        (out / ".chunks" / "job.json").write_text(json.dumps(job))
    result = encode(model, corpus, out, "--chunk-rows", str(CHUNK_ROWS))
    assert result.returncode == 0, result.stderr
    assert (out / ".chunks" / "mine.txt").read_text() == "precious\n"
    assert "removed" not in result.stderr, result.stderr


# --- 1: what an earlier run of this job left is removed, and named ----------------------------


def test_an_earlier_shard_of_this_job_is_removed_and_named(tmp_path, model, corpus):
    out = tmp_path / "out"
    texts = corpus.read_text(encoding="utf-8").splitlines()
    # Rank 1 of 2 finished alone (its shard and record written), then the job is run again
    # in one process: rank 1's shard is this job's, of another world size.
    encode_shard(texts, out, TextEncoder.from_pretrained(model), rank=1, world=2,
                 chunk_rows=CHUNK_ROWS)  # fmt: skip
    (out / "shard-notes.txt").write_text("precious\n")
    result = encode(model, corpus, out, "--chunk-rows", str(CHUNK_ROWS))
    assert result.returncode == 0, result.stderr
    assert (
        "removed what an earlier run of this job left in "
        f"{out}: shard-00001-of-00002.json, shard-00001-of-00002.npy"
    ) in result.stderr, result.stderr
    assert names(out) == [
        "manifest.json", "shard-00000-of-00001.json", "shard-00000-of-00001.npy",
        "shard-notes.txt",
    ]  # fmt: skip


# --- 7: one line per chunk and rank under torchrun ---------------------------------------------


@pytest.mark.parametrize("flag", ["--progress", None])
def test_each_rank_of_several_prints_a_line_per_chunk(tmp_path, model, corpus, monkeypatch, flag):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    flags = [flag] if flag else []
    result = encode(model, corpus, tmp_path / "out", "--chunk-rows", str(CHUNK_ROWS), *flags)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if ": chunk " in line]
    # Rank 1 of 2 owns chunks 2-4 of 5: rows 16-40.
    assert [line.split(": ")[1] for line in lines] == [
        "chunk 2 (rows 16-24) committed", "chunk 3 (rows 24-32) committed",
        "chunk 4 (rows 32-40) committed",
    ], result.stderr  # fmt: skip
    assert all(line.startswith("rank 1/2: chunk ") for line in lines)
    assert "8/24 rows, " in lines[0] and " rows/s" in lines[0], lines
    assert lines[-1].endswith("24/24 rows") or "24/24 rows, " in lines[-1], lines
    assert "\r" not in result.stderr


def test_no_progress_keeps_the_ranks_quiet(tmp_path, model, corpus, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    result = encode(
        model, corpus, tmp_path / "out", "--chunk-rows", str(CHUNK_ROWS), "--no-progress"
    )
    assert result.returncode == 0, result.stderr
    assert ": chunk " not in result.stderr and "rank 0/2: wrote" in result.stderr


def test_reused_chunks_are_counted_but_not_in_the_rate(tmp_path, model, corpus, monkeypatch):
    out = tmp_path / "out"
    texts = corpus.read_text(encoding="utf-8").splitlines()
    encode_shard(texts, out, TextEncoder.from_pretrained(model), rank=1, world=2,
                 chunk_rows=CHUNK_ROWS)  # fmt: skip
    (out / "shard-00001-of-00002.json").unlink()  # rank 1 killed before recording its shard
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    result = encode(model, corpus, out, "--chunk-rows", str(CHUNK_ROWS), "--progress")
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if ": chunk " in line]
    assert lines[0] == "rank 1/2: chunk 2 (rows 16-24) reused: 8/24 rows", lines


# --- 8: the Ray and Spark adapters check their options where they are made ---------------------

BAD_OPTIONS = [
    ({"precision": "fp16"}, ValueError, r"precision must be one of .*got 'fp16'"),
    ({"batch_size": 0}, ValueError, "batch_size must be a positive int or None, got 0"),
    ({"max_tokens": 0}, ValueError, "max_tokens must be a positive int, got 0"),
    ({"workers": 0}, ValueError, "workers must be a positive int, got 0"),
    ({"normalize": "no"}, TypeError, "normalize must be a bool"),
    ({"dimensions": 0}, ValueError, "dimensions must be a positive int or None, got 0"),
    ({"prompt_name": 3}, TypeError, "prompt_name must be a str or None"),
    ({"progress": True}, TypeError, "progress is not an option of a Ray or Spark adapter"),
    ({"batchsize": 8}, TypeError, "unknown encode option 'batchsize'"),
]


def no_model_load(monkeypatch):
    """Fail the test if a model is loaded: the options are checked before."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the options were checked")

    monkeypatch.setattr(TextEncoder, "from_pretrained", refuse)


@pytest.mark.parametrize(("options", "error", "message"), BAD_OPTIONS)
def test_the_ray_embedder_checks_its_options_before_loading(monkeypatch, options, error, message):
    from clearformer.sharded.ray_adapter import TextEmbedder

    no_model_load(monkeypatch)
    with pytest.raises(error, match=message):
        TextEmbedder("no/such/model", **options)
    with pytest.raises(error, match=message):  # on the driver, for fn_constructor_kwargs
        TextEmbedder.arguments(model="no/such/model", **options)


def test_the_ray_embedders_arguments_are_its_constructors(model):
    from clearformer.sharded.ray_adapter import TextEmbedder

    kwargs = TextEmbedder.arguments(model=str(model), precision="float32", batch_size=4)
    assert kwargs == {"model": str(model), "precision": "float32", "batch_size": 4}
    out = TextEmbedder(**kwargs)({"text": np.array(["w1 w2", "w3"])})
    np.testing.assert_array_equal(
        out["embedding"], TextEncoder.from_pretrained(model).encode(["w1 w2", "w3"])
    )


@pytest.mark.parametrize(("options", "error", "message"), BAD_OPTIONS)
def test_the_spark_udf_checks_its_options_on_the_driver(monkeypatch, options, error, message):
    from clearformer.sharded.spark_adapter import embedding_udf

    no_model_load(monkeypatch)
    with pytest.raises(error, match=message):
        embedding_udf("no/such/model", **options)
