"""The texts store of a folder of kinds, after a crash or damage: a first build killed before
its texts store was renamed into place runs again; a damaged ``texts.json`` is written again
by the same build, from the databases beside it, before and after an add."""

from __future__ import annotations

import json
import signal

import pytest

from clearformer.index import (
    BM25Index,
    HybridIndex,
    KindsDisagreeError,
    SparseOptions,
    add_to_kinds,
    build_index,
    layout,
    open_kind_index,
)

from .hybrid_helpers import FakeSparseEncoder, word_corpus
from .index_helpers import cli, killed_cli

pytest.importorskip("bm25s")

TEXTS = word_corpus(40, seed=3)
IDS = [f"doc-{i}" for i in range(len(TEXTS))]
MORE = word_corpus(60, seed=8)[40:]
MORE_IDS = [f"doc-{i}" for i in range(40, 60)]


def build(out, *flags):
    return cli("index", "build", "--kind", "bm25", "--out", str(out), "--no-progress", *flags)


def snapshot(folder):
    return sorted((str(p), p.read_bytes()) for p in folder.rglob("*") if p.is_file())


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    return path


def test_a_first_build_killed_before_its_texts_store_was_renamed_runs_again(tmp_path, corpus):
    out = tmp_path / "idx"
    argv = ("index", "build", "--kind", "bm25", "--corpus", str(corpus), "--out", str(out))
    killed = killed_cli("clearformer.index.collection:write_texts:1", *argv, "--no-progress")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    left = sorted(p.name for p in out.iterdir())
    assert left[0] == ".lock" and left[1].startswith(".texts.tmp-") and len(left) == 2
    result = build(out, "--corpus", str(corpus))
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == [".lock", "bm25", "texts"]
    assert BM25Index.open(out).rows == len(TEXTS)


def test_stale_texts_temporaries_are_removed_by_the_next_writer(tmp_path, corpus):
    """The brief's reproduction: only the lock and a stale temporary (of another process)."""
    out = tmp_path / "idx"
    (out / ".texts.tmp-999").mkdir(parents=True)
    (out / ".texts.tmp-999" / "texts.sqlite").write_bytes(b"half")
    (out / ".lock").touch()
    assert build(out, "--corpus", str(corpus)).returncode == 0
    (out / ".texts.tmp-998").mkdir()  # left beside a whole store: the next writer removes it
    assert build(out, "--corpus", str(corpus)).returncode == 0
    assert not list(out.glob(".texts.tmp-*"))


def test_a_folder_of_other_files_is_still_refused(tmp_path, corpus):
    out = tmp_path / "idx"
    out.mkdir()
    (out / ".lock").touch()
    (out / "notes.txt").write_text("mine")
    result = build(out, "--corpus", str(corpus))
    assert result.returncode == 2
    assert "holds no index; give a new or empty one" in result.stderr
    assert sorted(p.name for p in out.iterdir()) == [".lock", "notes.txt"]


@pytest.mark.parametrize("damage", ["rows only", "removed", "garbage"])
def test_the_same_build_writes_a_damaged_texts_record_again(tmp_path, corpus, damage):
    out = tmp_path / "idx"
    assert build(out, "--corpus", str(corpus)).returncode == 0
    record = out / "texts" / "texts.json"
    whole = json.loads(record.read_text())
    if damage == "removed":
        record.unlink()
    else:
        record.write_text('{"rows":2}' if damage == "rows only" else "\x93garbage")
    result = build(out, "--corpus", str(corpus))
    assert result.returncode == 0, result.stderr
    assert json.loads(record.read_text()) == whole
    found = cli("search", "w1 w2", "--index", str(out), "--mode", "bm25", "--json")
    assert found.returncode == 0 and found.stdout.strip(), found.stderr


def test_a_damaged_record_with_other_texts_is_refused_changing_nothing(tmp_path, corpus):
    out = tmp_path / "idx"
    assert build(out, "--corpus", str(corpus)).returncode == 0
    (out / "texts" / "texts.json").write_text('{"rows":2}')
    other = tmp_path / "other.txt"
    other.write_text("w1 w2\n", encoding="utf-8")
    before = snapshot(out)
    result = build(out, "--corpus", str(other))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "texts.json is damaged" in lines[0]
    assert "build without --corpus" in lines[0]
    assert snapshot(out) == before


@pytest.fixture
def added(tmp_path):
    """A bm25 and a sparse kind over TEXTS, then MORE added: the store's record names the
    add's database."""
    out = tmp_path / "idx"
    build_index(out, TEXTS, FakeSparseEncoder(), kind="sparse", ids=IDS,
                options=SparseOptions(chunk_rows=16))  # fmt: skip
    build_index(out, TEXTS, kind="bm25", ids=IDS)
    add_to_kinds(out, MORE, [FakeSparseEncoder()], ids=MORE_IDS)
    return out


def test_after_an_add_a_build_over_the_held_texts_writes_the_record_again(added, corpus):
    record = added / "texts" / "texts.json"
    whole = json.loads(record.read_text())
    record.write_text('{"rows":2}')
    before = snapshot(added)
    refused = build(added, "--corpus", str(corpus))  # the first corpus lacks the added texts
    assert refused.returncode == 2
    assert "build without --corpus" in refused.stderr and str(record) in refused.stderr
    assert snapshot(added) == before
    result = build(added)  # without --corpus: over the texts the newest database holds
    assert result.returncode == 0, result.stderr
    again = json.loads(record.read_text())
    assert {k: again[k] for k in ("rows", "content", "file")} == {
        k: whole[k] for k in ("rows", "content", "file")
    }
    assert open_kind_index(added, "bm25").rows == open_kind_index(added, "sparse").rows == 60
    assert open_kind_index(added, "bm25").texts.all()[1] == TEXTS + MORE


class Killed(Exception):
    pass


def test_a_kind_a_stopped_add_left_behind_still_opens_after_the_repair(added, monkeypatch):
    """The record's earlier states come back from the kinds: bm25, left at 60 rows by an add
    stopped after sparse's commit, opens, and the same add finishes it."""
    more = word_corpus(70, seed=9)[60:]
    more_ids = [f"doc-{i}" for i in range(60, 70)]
    commit, calls = layout.commit, []

    def dying(*args):
        calls.append(args)
        if len(calls) == 2:  # sparse committed, bm25 not
            raise Killed
        commit(*args)

    monkeypatch.setattr(layout, "commit", dying)
    with pytest.raises(Killed):
        add_to_kinds(added, more, [FakeSparseEncoder()], ids=more_ids)
    monkeypatch.undo()
    (added / "texts" / "texts.json").write_text("{}")
    everything = TEXTS + MORE + more, IDS + MORE_IDS + more_ids
    build_index(added, everything[0], FakeSparseEncoder(), kind="sparse", ids=everything[1],
                options=SparseOptions(chunk_rows=16))  # fmt: skip
    assert open_kind_index(added, "bm25").rows == 60  # a state the record holds again
    with pytest.raises(KindsDisagreeError):
        HybridIndex.open(added, [FakeSparseEncoder()])
    done = add_to_kinds(added, more, [FakeSparseEncoder()], ids=more_ids)
    assert done.added == 0 and done.kinds["bm25"] == (60, 70)


def test_a_damaged_database_of_an_add_with_the_record_lost_is_refused(added):
    record = added / "texts" / "texts.json"
    name = json.loads(record.read_text())["file"]
    record.write_text("{}")
    database = added / "texts" / name
    database.write_bytes(database.read_bytes()[:100])
    result = build(added)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{database} is damaged too" in lines[0]
    assert "--corpus" in lines[0]


def test_a_dense_kind_of_other_texts_than_the_store_is_refused(tmp_path):
    # The dense kind keeps its own texts; hybrid results take each row's text from the store.
    # The store damaged and written again by a build of other texts (as many rows) must not
    # be fused with the dense rows of the first texts.
    import shutil

    from clearformer import TextEncoder

    from .index_helpers import tiny_model

    dense = TextEncoder.from_pretrained(tiny_model(tmp_path / "tiny"))
    root = tmp_path / "idx"
    build_index(root, TEXTS, dense, kind="dense", ids=IDS)
    assert HybridIndex.open(root, [dense]).search("w1 w2", k=3)
    shutil.rmtree(root / "texts")
    other = word_corpus(40, seed=99)
    build_index(root, other, kind="bm25", ids=IDS)
    with pytest.raises(layout.IndexDamagedError, match="dense.*meta.json.*records texts"):
        HybridIndex.open(root, [dense])
    with pytest.raises(layout.IndexDamagedError, match="records texts"):
        add_to_kinds(root, MORE, [dense], ids=MORE_IDS)
    build_index(root, other, dense, kind="dense", ids=IDS)  # the same build repairs it
    hits = HybridIndex.open(root, [dense]).search("w1 w2", k=40)
    assert {hit.text for hit in hits} == set(other)
