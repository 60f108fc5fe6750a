"""``clearformer encode --input CORPUS --output DIR``: one shard per process (torchrun), a
manifest with rows, checksums and the model's identity, and shards that together are the bits
of a one-process run of the same command, whether the run went through or was killed and run
again: a killed one-process run resumed by two processes, and one of two processes killed with
SIGKILL (while committing a chunk, or while writing its shard) after the other had finished,
then the same command again.

Every run here computes at one thread per process: torchrun's processes run at one (the
tests' environment says so), and the tiny model's heads are 8 wide, where PyTorch's attention
kernel can round otherwise at another thread count (docs/index.md)."""

from __future__ import annotations

import json
import signal

import numpy as np
import pytest

from clearformer.index.identity import file_sha256
from clearformer.sharded.shards import rank_chunks, read_manifest, read_shards

from .helpers import intra_op_threads, needs_avx512_library
from .index_helpers import cli, faulty_torchrun, killed_cli, tiny_model, torchrun, word_texts

SHARDS_MODULE = "clearformer.sharded.shards"
CHUNK_ROWS = 32  # 300 rows: 10 chunks, rank 0 of 2 takes chunks 0-4 (rows 0-160), rank 1 5-9
SHARDS = [
    "manifest.json",
    "shard-00000-of-00002.json",
    "shard-00000-of-00002.npy",
    "shard-00001-of-00002.json",
    "shard-00001-of-00002.npy",
]


def one_thread_cli(*argv: str):
    with intra_op_threads(1):
        return cli(*argv)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    model = tiny_model(root / "model")
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(word_texts(300)) + "\n", encoding="utf-8")
    single = root / "single.npy"
    result = one_thread_cli(
        "encode", "--input", str(corpus), "--output", str(single), "--model", str(model)
    )
    assert result.returncode == 0, result.stderr
    return model, corpus, np.load(single)


def command(setup, out, *flags: str) -> tuple[str, ...]:
    model, corpus, _ = setup
    return ("encode", "--input", str(corpus), "--output", str(out), "--model", str(model),
            "--chunk-rows", str(CHUNK_ROWS), *flags)  # fmt: skip


@pytest.fixture(scope="module")
def one_process(setup, tmp_path_factory):
    out = tmp_path_factory.mktemp("one") / "out"
    result = one_thread_cli(*command(setup, out))
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture(scope="module")
def two_processes(setup, tmp_path_factory):
    out = tmp_path_factory.mktemp("two") / "out"
    result = torchrun(2, "-m", "clearformer", *command(setup, out))
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def test_rank_shares_are_whole_chunks_in_order():
    for rows, world in [(300, 2), (300, 3), (10, 4), (64, 1)]:
        shares = [rank_chunks(rows, 32, r, world) for r in range(world)]
        assert [c for share in shares for c in share] == list(range((rows + 31) // 32))


def test_one_process_writes_a_shard_and_a_manifest(setup, one_process):
    _, _, single = setup
    manifest = read_manifest(one_process)
    assert (manifest["rows"], manifest["world"], manifest["dimensions"]) == (300, 1, 16)
    (shard,) = manifest["shards"]
    assert shard["sha256"] == file_sha256(one_process / shard["file"])
    assert shard["rows"] == [0, 300]
    assert manifest["model"]["revision"] and manifest["model"]["width"] == 16
    # Cut into chunks or encoded in one call, a text's embedding is the same bits.
    np.testing.assert_array_equal(read_shards(one_process), single)
    assert not (one_process / ".chunks").exists()
    again = one_thread_cli(*command(setup, one_process))
    assert again.returncode == 0 and "nothing to do" in again.stderr


def test_two_processes_give_the_bits_of_one(setup, one_process, two_processes):
    manifest = read_manifest(two_processes)
    assert [s["rows"] for s in manifest["shards"]] == [[0, 160], [160, 300]]
    np.testing.assert_array_equal(read_shards(two_processes), read_shards(one_process))
    assert sorted(p.name for p in two_processes.iterdir()) == SHARDS


def test_a_killed_run_resumes_its_chunks_with_another_process_count(tmp_path, setup, one_process):
    pytest.importorskip("pyarrow")
    out = tmp_path / "out"
    argv = command(setup, out, "--shard-format", "parquet")
    killed = killed_cli("clearformer.index.chunks:ChunkStore.write:6", *argv)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert len(list((out / ".chunks").glob("chunk-*.npy"))) == 5
    assert not (out / "manifest.json").exists()
    result = torchrun(2, "-m", "clearformer", *argv)
    assert result.returncode == 0, result.stderr[-3000:]
    # Rank 0 owns chunks 0-4, all committed before the kill; rank 1 owns 5-9.
    assert "rank 0/2: wrote" in result.stderr
    assert "(0 chunk(s) encoded, 5 reused: chunks 0-4)" in result.stderr
    assert "(5 chunk(s) encoded)" in result.stderr
    np.testing.assert_array_equal(read_shards(out), read_shards(one_process))
    import pyarrow.parquet as pq

    manifest = read_manifest(out)
    table = pq.read_table(out / manifest["shards"][1]["file"])
    assert table.column("row").to_pylist()[0] == 160
    assert table.column("text").to_pylist()[0] == word_texts(300)[160]
    assert sorted(p.name for p in out.iterdir()) == [n.replace(".npy", ".parquet") for n in SHARDS]


def test_a_run_killed_right_after_its_manifest_leaves_its_chunks_to_the_next_run(
    tmp_path, setup, one_process
):
    out = tmp_path / "out"
    argv = command(setup, out)
    # The first rmtree is the chunks': the manifest is written, nothing is removed yet.
    killed = killed_cli("clearformer.sharded.directory:shutil.rmtree:1", *argv)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert (out / "manifest.json").is_file()
    assert len(list((out / ".chunks").glob("chunk-*.npy"))) == 10
    again = one_thread_cli(*argv)
    assert again.returncode == 0, again.stderr
    assert "nothing to do (removed what a killed run left: .chunks)" in again.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in one_process.iterdir())
    np.testing.assert_array_equal(read_shards(out), read_shards(one_process))


# Rank 0 is killed on its Nth np.save (its chunks', then its shard's), inside the file's
# atomic write (the temporary file is open), once rank 1 has written and recorded its shard.
# when: (the np.save call, the temporary file it leaves, chunks committed, what rank 0 then
# says it encoded and reused).
KILLS = {
    "while committing its third chunk": (
        3, ".chunks/.chunk-000002.npy.*.tmp", 7, "3 chunk(s) encoded, 2 reused: chunks 0-1"
    ),
    "while writing its shard": (
        6, ".shard-00000-of-00002.npy.*.tmp", 10, "0 chunk(s) encoded, 5 reused: chunks 0-4"
    ),
}  # fmt: skip


@pytest.mark.parametrize("when", list(KILLS))
def test_one_of_two_processes_killed_then_the_same_command_again(
    tmp_path, setup, two_processes, when
):
    call, leftover, committed, rank0 = KILLS[when]
    out = tmp_path / "out"
    rank1_done = str(out / "shard-00001-of-00002.json")
    killed = faulty_torchrun(
        2,
        tmp_path,
        [{"target": "numpy:save", "call": call, "rank": 0, "wait_for": rank1_done, "kill": True}],
        *command(setup, out),
    )
    assert killed.returncode != 0, killed.stderr[-3000:]
    assert not (out / "manifest.json").exists()
    assert len(list(out.glob(".chunks/chunk-*.npy"))) == committed
    assert len(list(out.glob(leftover))) == 1  # killed mid-write: its temporary file stays

    # Again, with rank 0 finishing (and so writing the manifest and removing the chunks) only
    # after rank 1 has started over, and rank 1 reading a chunk, if it reads one, only after
    # that: rank 1 must need no chunk once it has found its shard recorded.
    started = str(tmp_path / "rank1-started")
    faults = [
        {"target": f"{SHARDS_MODULE}:_recorded", "call": 1, "rank": 1, "touch": started},
        {"target": f"{SHARDS_MODULE}:_finish", "call": 1, "rank": 0, "wait_for": started},
        {"target": "clearformer.index.chunks:ChunkStore.read", "call": 1, "rank": 1,
         "wait_for": str(out / "manifest.json")},
    ]  # fmt: skip
    resumed = faulty_torchrun(2, tmp_path, faults, *command(setup, out))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"rank 0/2: wrote {out}/shard-00000-of-00002.npy: rows 0-160 ({rank0})" in resumed.stderr
    assert f"rank 1/2: kept {out}/shard-00001-of-00002.npy, written by an earlier run: " \
        "rows 160-300 (chunks 5-9 reused)" in resumed.stderr  # fmt: skip

    # The uninterrupted run's files, to the byte; nothing else left (no chunk, no temporary).
    assert sorted(p.name for p in out.iterdir()) == SHARDS
    for name in SHARDS[1:]:
        assert (out / name).read_bytes() == (two_processes / name).read_bytes(), name
    manifest = read_manifest(out)
    assert manifest == read_manifest(two_processes)
    starts = [s["rows"][0] for s in manifest["shards"]]
    stops = [s["rows"][1] for s in manifest["shards"]]
    assert starts[0] == 0 and stops[-1] == manifest["rows"] == 300 and starts[1:] == stops[:-1]
    assert sum(s["count"] for s in manifest["shards"]) == 300
    np.testing.assert_array_equal(read_shards(out), read_shards(two_processes))


class TestWithTheAVX512Library:
    """Where clearformer's AVX-512 linear kernel is loaded, reordered weights take some products to
    it, which rounds otherwise than oneDNN on plain ones, and ``encode`` packs once a process's
    calls have carried ``REORDER_MIN_TOKENS``: without packing from the first chunk, a chunk's
    rows would depend on the chunks its process happened to compute before it."""

    pytestmark = needs_avx512_library

    def test_a_row_does_not_depend_on_what_its_process_computed_before(self, tmp_path, monkeypatch):
        from clearformer.sharded.shards import encode_shard
        from clearformer.text import TextEncoder

        from .helpers import write_tiny_bert
        from .index_helpers import WORDS

        monkeypatch.setenv("CLEARFORMER_AVX512", "on")  # the suite switches it off (conftest)
        # Width 64: products the kernel serves (its panels are 64 outputs wide).
        model = write_tiny_bert(tmp_path / "model", WORDS, width=64, heads=4)
        texts = word_texts(600)  # about 3,600 tokens: a one-process run packs part-way
        with intra_op_threads(1):
            plain = TextEncoder.from_pretrained(model).encode(texts[:64])
            packed = TextEncoder.from_pretrained(model)
            packed.keep_weights_reordered()
            # Negative control: packed and plain weights do give other bits here.
            assert not np.array_equal(packed.encode(texts[:64]), plain)
            one = encode_shard(texts, tmp_path / "one", TextEncoder.from_pretrained(model),
                               chunk_rows=CHUNK_ROWS)  # fmt: skip
            assert one.manifest
            for rank in (0, 1):  # two processes: a fresh encoder each
                encode_shard(texts, tmp_path / "two", TextEncoder.from_pretrained(model),
                             rank=rank, world=2, chunk_rows=CHUNK_ROWS)  # fmt: skip
        np.testing.assert_array_equal(read_shards(tmp_path / "two"), read_shards(tmp_path / "one"))


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


def test_auto_precision_is_recorded_as_what_it_chose(tmp_path, monkeypatch):
    from clearformer.options import Decision
    from clearformer.sharded.shards import encode_shard
    from clearformer.text import TextEncoder

    model = tiny_model(tmp_path / "model")
    texts = word_texts(40)
    encoder = TextEncoder.from_pretrained(model)
    chosen = encoder.precision_for("auto").choice
    with intra_op_threads(1):
        encode_shard(texts, tmp_path / "out", encoder, precision="auto", chunk_rows=CHUNK_ROWS)
    assert read_manifest(tmp_path / "out")["job"]["precision"] == chosen != "auto"

    # A machine whose "auto" chooses otherwise computes other rows: another job, refused in
    # the same directory rather than mixed with these shards.
    other = "float32" if chosen != "float32" else "bf16"
    elsewhere = TextEncoder.from_pretrained(model)
    monkeypatch.setattr(
        elsewhere, "precision_for", lambda precision="auto": Decision(other, "another CPU")
    )
    with pytest.raises(ValueError, match="already holds the shards of another run"):
        encode_shard(texts, tmp_path / "out", elsewhere, precision="auto", chunk_rows=CHUNK_ROWS)
    # An unknown precision is refused before any work (no directory made).
    with pytest.raises(ValueError, match="precision"):
        encode_shard(texts, tmp_path / "never", encoder, precision="fp8", chunk_rows=CHUNK_ROWS)
    assert not (tmp_path / "never").exists()
