"""``clearformer encode --output DIR`` (sharded) when something is wrong: embeddings that are
not finite, a directory named as the docs name it, shards missing or damaged after the
manifest, an empty Parquet shard, a resume with another backend or device, JSON that is not
an object, a killed manifest write's temporary file, a file where the directory should be, a
named pipe as input, shard options without a shard directory, the progress line, the Ray
adapter's null texts, and a one-process shard equal to ``encode --output FILE.npy``."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
from argparse import Namespace

import numpy as np
import pytest

from clearformer.sharded import directory, shards
from clearformer.sharded.shards import encode_shard, read_manifest, read_shards
from clearformer.text import TextEncoder

from .helpers import intra_op_threads, needs_avx512_library
from .index_helpers import WORDS, cli, tiny_model, word_texts

CHUNK_ROWS = 8  # 40 rows: 5 chunks
SHARD = "shard-00000-of-00001.npy"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("model") / "model")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text("\n".join(word_texts(40)) + "\n", encoding="utf-8")
    return path


def encode(model, corpus, out, *flags: str):
    return cli("encode", "--model", str(model), "--input", str(corpus), "--output", str(out),
               *flags)  # fmt: skip


@pytest.fixture(scope="module")
def finished(model, corpus, tmp_path_factory):
    """A finished one-process run: the shard, its record and the manifest."""
    out = tmp_path_factory.mktemp("finished") / "out"
    result = encode(model, corpus, out, "--chunk-rows", str(CHUNK_ROWS))
    assert result.returncode == 0, result.stderr
    return out


def copy_of(finished, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(finished, out)
    return out


def one_error_line(result) -> str:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    return line


# --- B1: NaN or infinity is refused before a chunk is committed ----------------------------


@pytest.fixture(scope="module")
def nan_model(tmp_path_factory):
    """The tiny checkpoint with a NaN in the embedding row of the word "w7"."""
    from safetensors.torch import load_file, save_file

    directory = tiny_model(tmp_path_factory.mktemp("nan") / "model")
    path = directory / "model.safetensors"
    tensors = load_file(str(path))
    tensors["embeddings.word_embeddings.weight"][WORDS.index("w7"), 0] = float("nan")
    save_file(tensors, str(path), metadata={"format": "pt"})
    return directory


def test_nan_rows_are_refused_before_their_chunk_is_committed(tmp_path, nan_model):
    texts = [f"w{1 + i % 6} w{10 + i % 5}" for i in range(40)]
    texts[20] = "w7 w1"  # in chunk 2: rows 16-24
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(texts) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    line = one_error_line(encode(nan_model, corpus, out, "--chunk-rows", str(CHUNK_ROWS)))
    assert "the embeddings of 1 of 8 texts in rows 16-24 are not finite" in line, line
    assert "texts 20 ('w7 w1')" in line and "no shard was written" in line
    # The chunks before it are committed (and finite); that chunk and no shard are.
    assert sorted(p.name for p in (out / ".chunks").glob("chunk-*")) == [
        "chunk-000000.npy",
        "chunk-000001.npy",
    ]
    assert not list(out.glob("shard-*")) and not (out / "manifest.json").exists()

    # In one chunk, the message is the file route's, but for what was not written.
    as_file = one_error_line(encode(nan_model, corpus, tmp_path / "emb.npy"))
    sharded = one_error_line(encode(nan_model, corpus, tmp_path / "whole"))
    assert as_file.split("; nothing was written")[0] == sharded.split("; that chunk")[0]
    assert not list((tmp_path / "whole").glob("shard-*"))


# --- B2: --output DIR/ is made if missing; a name with another suffix is still refused -----


def test_a_directory_output_written_with_a_separator_is_made(tmp_path, model, corpus):
    result = encode(model, corpus, f"{tmp_path / 'corpus.emb'}{os.sep}")
    assert result.returncode == 0, result.stderr
    assert read_manifest(tmp_path / "corpus.emb")["rows"] == 40
    # Without the separator, a new name with an unknown suffix is a typo for a file.
    line = one_error_line(encode(model, corpus, tmp_path / "other.emb"))
    assert "--output must end in .npy or .jsonl, or name a directory of shards (DIR/" in line
    assert not (tmp_path / "other.emb").exists()


# --- B3: a shard missing or damaged after the manifest --------------------------------------


def _remove(path):
    path.unlink()


def _truncate(path):
    path.write_bytes(path.read_bytes()[:100])


def _flip_a_byte(path):
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # the size kept: only the checksum shows it
    path.write_bytes(bytes(data))


DAMAGE = {
    "removed": (_remove, "is missing"),
    "truncated": (_truncate, "holds 100 bytes, where"),
    "a byte changed": (_flip_a_byte, "does not match its recorded SHA-256"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_missing_or_damaged_shard_is_an_error_not_nothing_to_do(
    tmp_path, model, corpus, finished, damage
):
    harm, problem = DAMAGE[damage]
    out = copy_of(finished, tmp_path)
    harm(out / SHARD)
    line = one_error_line(encode(model, corpus, out, "--chunk-rows", str(CHUNK_ROWS)))
    assert f"{out / SHARD} {problem}" in line, line
    assert f"remove {out} and run again" in line


# --- B4: an empty Parquet shard (more ranks than chunks) ------------------------------------


def test_an_empty_parquet_shard_is_read_with_the_manifests_width(tmp_path, model):
    pytest.importorskip("pyarrow")
    texts = word_texts(12)
    encoder = TextEncoder.from_pretrained(model)
    for rank in range(3):  # one chunk of 12 rows: ranks 0 and 1 take none
        encode_shard(texts, tmp_path / "out", encoder, rank=rank, world=3, chunk_rows=12,
                     fmt="parquet")  # fmt: skip
    assert [s["count"] for s in read_manifest(tmp_path / "out")["shards"]] == [0, 0, 12]
    vectors = read_shards(tmp_path / "out")
    assert vectors.shape == (12, 16)
    np.testing.assert_allclose(vectors, encoder.encode(texts), atol=1e-6)


# --- B5: a resume with another backend or device --------------------------------------------


class Killed(Exception):
    pass


def killed_after_two_chunks(model, corpus, out):
    """A run stopped after committing two chunks, as a kill leaves it."""

    def stop(index, reused):
        if index == 1:
            raise Killed

    texts = corpus.read_text(encoding="utf-8").splitlines()
    with pytest.raises(Killed):
        encode_shard(texts, out, TextEncoder.from_pretrained(model), chunk_rows=CHUNK_ROWS,
                     on_chunk=stop)  # fmt: skip
    assert len(list((out / ".chunks").glob("chunk-*.npy"))) == 2


def test_a_resume_with_another_backend_or_device_is_refused(tmp_path, model, corpus):
    out = tmp_path / "out"
    killed_after_two_chunks(model, corpus, out)
    job = json.loads((out / ".chunks" / "job.json").read_text())
    assert (job["backend"], job["device"]) == ("auto", "cpu")
    line = one_error_line(encode(model, corpus, out, "--chunk-rows", str(CHUNK_ROWS),
                                 "--backend", "math"))  # fmt: skip
    assert "holds the chunks of another job (it differs in backend)" in line, line
    # A run on another device (here: its record says cuda) is refused the same way.
    (out / ".chunks" / "job.json").write_text(json.dumps({**job, "device": "cuda"}))
    line = one_error_line(encode(model, corpus, out, "--chunk-rows", str(CHUNK_ROWS)))
    assert "(it differs in device)" in line, line


# --- B6: a record or manifest that is JSON but no object ------------------------------------


@pytest.mark.parametrize("name", ["manifest.json", "shard-00000-of-00001.json"])
def test_json_that_is_no_object_is_one_error_line_naming_the_file(
    tmp_path, model, corpus, finished, name
):
    out = copy_of(finished, tmp_path)
    if name != "manifest.json":
        (out / "manifest.json").unlink()  # else the record is never read
    (out / name).write_text("[1]\n")
    line = one_error_line(encode(model, corpus, out, "--chunk-rows", str(CHUNK_ROWS)))
    assert f"{out / name} holds a JSON array, not the object a" in line, line


# --- B7: a killed manifest write's temporary file -------------------------------------------


def test_a_killed_manifest_writes_temporary_file_is_removed(tmp_path, model, corpus, finished):
    out = copy_of(finished, tmp_path)
    # Killed while writing the manifest: the shard recorded, the temporary file left.
    (out / "manifest.json").unlink()
    (out / ".manifest.json.k1ll3d.tmp").write_text("{")
    result = encode(model, corpus, out, "--chunk-rows", str(CHUNK_ROWS))
    assert result.returncode == 0 and "kept" in result.stderr, result.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in finished.iterdir())

    # Killed after another rank had written it: the next run finds it complete.
    (out / ".manifest.json.k1ll3d.tmp").write_text("{")
    result = encode(model, corpus, out, "--chunk-rows", str(CHUNK_ROWS))
    assert result.returncode == 0, result.stderr
    assert "nothing to do (removed what a killed run left: .manifest.json.k1ll3d.tmp)" in (
        result.stderr
    )
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in finished.iterdir())


def test_two_ranks_writing_the_same_manifest_at_once_both_finish(tmp_path, monkeypatch):
    """The rank that publishes first removes the manifest's temporary files, the other rank's
    among them: that one finds its own gone and the same manifest in place."""
    import clearformer.io

    publish = clearformer.io.publish

    def twin_first(tmp, target):
        if str(target).endswith("manifest.json"):
            other = tmp_path / ".manifest.json.other.tmp"
            other.write_text(json.dumps(manifest))
            publish(other, target)  # the twin publishes first and removes the leftovers
            directory.remove_leftovers(tmp_path, manifest)
        publish(tmp, target)

    monkeypatch.setattr(clearformer.io, "publish", twin_first)
    manifest = {"job": {"rows": 1}, "shards": [{"file": "s"}], "world": 1}
    shards._write_manifest(tmp_path, manifest)
    assert json.loads((tmp_path / "manifest.json").read_text()) == manifest
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]
    # Another manifest in place is no twin's: the error stands.
    with pytest.raises(FileNotFoundError):
        shards._write_manifest(tmp_path, {**manifest, "job": {"rows": 2}})


# --- B8: an existing file as --output without a suffix --------------------------------------


def test_an_existing_file_as_a_shard_directory_is_refused(tmp_path, model, corpus):
    plain = tmp_path / "plainfile"
    plain.write_text("x\n")
    for output in (str(plain), f"{plain}{os.sep}"):
        line = one_error_line(encode(model, corpus, output))
        assert line.endswith(
            f"--output: {plain} is a file; expected a directory of shards, or FILE.npy / FILE.jsonl"
        ), line
    assert plain.read_text() == "x\n"


# --- B9: a named pipe (a process substitution, /dev/stdin) as --input -----------------------


def fed_fifo(path, data: bytes) -> threading.Thread:
    """A named pipe at ``path`` that a thread fills with ``data`` once a reader opens it."""
    os.mkfifo(path)

    def feed():
        with open(path, "wb") as handle:
            handle.write(data)

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    return writer


def test_a_named_pipe_is_read_as_input_once(tmp_path, model, corpus):
    data = corpus.read_bytes()
    writer = fed_fifo(tmp_path / "pipe", data)
    result = encode(model, tmp_path / "pipe", tmp_path / "emb.npy")
    writer.join(5)
    assert result.returncode == 0, result.stderr
    assert np.load(tmp_path / "emb.npy").shape == (40, 16)

    writer = fed_fifo(tmp_path / "pipe2", data)
    result = encode(model, tmp_path / "pipe2", tmp_path / "out")
    writer.join(5)
    assert result.returncode == 0, result.stderr
    # The corpus's hash is of the bytes read, not of a second read of a drained pipe.
    source = read_manifest(tmp_path / "out")["input"]
    assert source["sha256"] == hashlib.sha256(data).hexdigest()
    np.testing.assert_array_equal(read_shards(tmp_path / "out"), np.load(tmp_path / "emb.npy"))


# --- B10: shard options without a shard directory -------------------------------------------


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--chunk-rows", "4", "-o", "{tmp}/emb.npy"],
         "--chunk-rows applies to --output DIR (a directory of shards, e.g. corpus.emb/); "
         "got --output {tmp}/emb.npy"),
        (["--shard-format", "npy", "-o", "{tmp}/emb.jsonl"], "--shard-format applies to"),
        (["--shard-format", "parquet"], "--shard-format applies to --output DIR (a directory "
         "of shards, e.g. corpus.emb/); got stdout"),
    ],
)  # fmt: skip
def test_shard_options_without_a_shard_directory_are_refused(
    tmp_path, model, corpus, flags, message
):
    flags = [f.replace("{tmp}", str(tmp_path)) for f in flags]
    result = cli("encode", "--model", str(model), "--input", str(corpus), *flags)
    assert message.replace("{tmp}", str(tmp_path)) in one_error_line(result)
    assert result.stdout == "" and list(tmp_path.iterdir()) == []


def test_texts_as_arguments_with_a_shard_directory_are_refused(tmp_path, model, corpus):
    # They were left out without a word: the shards held the --input corpus alone.
    result = encode(model, corpus, tmp_path / "d", "w1 w2")
    assert "--output DIR needs --input FILE" in one_error_line(result)


# --- P: the progress line ---------------------------------------------------------------------


def test_the_progress_line_shows_the_rate_and_the_time_left(capsys):
    import time

    from clearformer.commands.status_line import progress_for

    update = progress_for(Namespace(progress=True, command="encode"), 1000)
    update(0, 1000)
    time.sleep(0.15)  # past a redraw's interval
    update(100, 1000)
    shown = capsys.readouterr().err
    assert "embedding 100/1,000 texts, " in shown and " texts/s, " in shown, shown
    assert shown.endswith(" left"), shown
    update(1000, 1000)
    shown = capsys.readouterr().err
    assert "embedding 1,000/1,000 texts" in shown and shown.endswith("\n"), shown  # ended


def test_the_default_progress_threshold_is_in_the_help(capsys, monkeypatch):
    from clearformer.cli import main
    from clearformer.commands import status_line
    from clearformer.commands.status_line import PROGRESS_MIN_TEXTS, progress_for

    with pytest.raises(SystemExit):
        main(["encode", "--help"])
    assert f"{PROGRESS_MIN_TEXTS} texts or more" in " ".join(capsys.readouterr().out.split())
    monkeypatch.setattr(status_line, "_stderr_is_terminal", lambda: True)
    default = Namespace(progress=None, command="encode")
    assert progress_for(default, PROGRESS_MIN_TEXTS - 1) is False
    assert callable(progress_for(default, PROGRESS_MIN_TEXTS))


def test_a_resume_that_reuses_the_last_chunks_ends_the_progress_line(tmp_path, model, corpus):
    out = tmp_path / "out"
    texts = corpus.read_text(encoding="utf-8").splitlines()
    # Rank 1 of 2 finished alone: its chunks (2-4) are committed, rank 0's are not.
    encode_shard(texts, out, TextEncoder.from_pretrained(model), rank=1, world=2,
                 chunk_rows=CHUNK_ROWS)  # fmt: skip
    result = encode(model, corpus, out, "--chunk-rows", str(CHUNK_ROWS), "--progress")
    assert result.returncode == 0, result.stderr
    assert "(2 chunk(s) encoded, 3 reused: chunks 2-4)" in result.stderr
    lines = result.stderr.split("\n")
    bar = [line for line in lines if "] embedding " in line]
    assert bar and "embedding 40/40 texts" in bar[-1], result.stderr  # reached its end
    assert all(line.startswith("wrote ") for line in lines if "wrote " in line), result.stderr


# --- The Ray adapter's null texts -------------------------------------------------------------


@pytest.mark.parametrize("missing", [None, float("nan"), 3])
def test_the_ray_embedder_refuses_a_text_that_is_no_string(model, missing):
    from clearformer.sharded.ray_adapter import TextEmbedder

    embedder = TextEmbedder(str(model))
    batch = {"text": np.array(["w1 w2", missing], dtype=object)}
    with pytest.raises(TypeError, match=r"column 'text': row 1 of this batch is .*expected a str"):
        embedder(batch)
    out = embedder({"text": np.array(["w1 w2", "w3"])})  # numpy's str_ texts: embedded
    assert out["embedding"].shape == (2, 16)


# --- A one-process shard is the bits of `encode --output FILE.npy` -------------------------


class TestWithTheAVX512Library:
    """Where clearformer's AVX-512 linear kernel is loaded, reordered and plain weights round
    otherwise; a file run packs its weights only for a call of ``REORDER_MIN_TOKENS`` tokens or
    more, and the shards must pack (or not) as it does."""

    pytestmark = needs_avx512_library

    @pytest.mark.parametrize("rows", [40, 600])  # about 160 and 3,600 tokens
    def test_a_shard_equals_the_file_run_below_and_above_the_packing_threshold(
        self, tmp_path, monkeypatch, rows
    ):
        from .helpers import write_tiny_bert

        monkeypatch.setenv("CLEARFORMER_AVX512", "on")  # the suite switches it off (conftest)
        # Width 64: products the kernel serves (its panels are 64 outputs wide).
        model = write_tiny_bert(tmp_path / "model", WORDS, width=64, heads=4)
        texts = word_texts(rows)
        with intra_op_threads(1):
            as_file = TextEncoder.from_pretrained(model).encode(texts)
            plain = TextEncoder.from_pretrained(model).encode(texts[:40])  # under the threshold
            packed = TextEncoder.from_pretrained(model)
            packed.keep_weights_reordered()
            # Negative control: packed and plain weights do give other bits here.
            assert not np.array_equal(packed.encode(texts[:40]), plain)
            encode_shard(texts, tmp_path / "out", TextEncoder.from_pretrained(model),
                         chunk_rows=32)  # fmt: skip
        np.testing.assert_array_equal(read_shards(tmp_path / "out"), as_file)
