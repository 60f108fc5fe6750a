"""``add_to_kinds``: texts added to a folder of kinds reach its texts store and every kind, as a
build of all the texts in one go gives them; exactly once; and an add stopped at any point --
while a kind encodes, at the texts store's commit, at each kind's commit, or by SIGKILL --
leaves a folder that opens consistently, and the same add again ends as an uninterrupted one."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from clearformer import TextEncoder
from clearformer.index import (
    HybridIndex,
    KindsDisagreeError,
    add_to_index,
    add_to_kinds,
    collection,
    layout,
    open_kind_index,
)
from clearformer.index.multivector_index import ENCODINGS, TOKEN_INDPTR, TOKENS
from clearformer.index.sparse_index import POSTINGS_INDPTR, POSTINGS_ROWS, POSTINGS_WEIGHTS

from .add_kinds_helpers import (
    IDS,
    TEXTS,
    A,
    B,
    assert_same_results,
    build_all,
    models,
    results,
    snapshot,
)
from .hybrid_helpers import FakeMultiVectorEncoder, FakeSparseEncoder
from .index_helpers import DIE_ON_CALL, env, tiny_model

pytest.importorskip("usearch")
pytest.importorskip("bm25s")

ROOT = Path(__file__).resolve().parents[1]
FILES = {
    "sparse": (POSTINGS_INDPTR, POSTINGS_ROWS, POSTINGS_WEIGHTS),
    "multivector": (TOKENS, TOKEN_INDPTR, ENCODINGS),
}


class Killed(BaseException):
    """Stands for the process dying: nothing in the add may catch it."""


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    return TextEncoder.from_pretrained(tiny_model(tmp_path_factory.mktemp("model") / "m"))


@pytest.fixture(scope="module")
def folders(tmp_path_factory, dense):
    """``a``: every kind over A; ``whole``: over A and B in one go; ``added``: ``a`` with B
    added (uninterrupted)."""
    root = tmp_path_factory.mktemp("add-kinds")
    build_all(root / "a", TEXTS[:A], IDS[:A], dense)
    build_all(root / "whole", TEXTS[:B], IDS[:B], dense)
    shutil.copytree(root / "a", root / "added")
    added = add_to_kinds(root / "added", TEXTS[A:B], models(dense), ids=IDS[A:B])
    assert (added.added, added.held, added.rows) == (B - A, 0, B)
    assert added.kinds == {kind: (A, B) for kind in ("dense", "sparse", "multivector", "bm25")}
    return {name: root / name for name in ("a", "whole", "added")}


def test_an_add_gives_each_kind_what_a_build_of_all_the_texts_gives(folders, dense):
    assert_same_results(results(folders["added"], dense), results(folders["whole"], dense))
    for kind, files in FILES.items():
        added, whole = (open_kind_index(folders[f], kind).folder for f in ("added", "whole"))
        for name in files:
            np.testing.assert_allclose(np.load(added / name), np.load(whole / name), atol=1e-6)
    _, added = collection.open_texts(folders["added"])
    _, whole = collection.open_texts(folders["whole"])
    assert (added["rows"], added["content"]) == (whole["rows"], whole["content"])
    assert added["prefixes"] == [
        {"rows": A, "content": collection.content_hash(TEXTS[:A], IDS[:A])}
    ]
    # The texts store's first database stays for readers that opened it, and no other.
    names = sorted(p.name for p in (folders["added"] / "texts").iterdir())
    assert names == sorted(["texts.json", "texts.sqlite", added["file"]])


def test_each_kind_opened_at_the_old_rows_still_reads_them(folders, dense):
    """A reader of a kind committed before an add reads its rows from the extended store."""
    old = open_kind_index(folders["a"], "sparse", FakeSparseEncoder())
    shutil.copytree(folders["a"] / "sparse", folders["added"].parent / "x" / "sparse")
    shutil.copytree(folders["added"] / "texts", folders["added"].parent / "x" / "texts")
    behind = open_kind_index(folders["added"].parent / "x", "sparse", FakeSparseEncoder())
    assert behind.rows == A
    assert behind.search("w1 w2 w3", k=10) == old.search("w1 w2 w3", k=10)


def test_the_same_add_twice_adds_nothing_and_a_union_adds_only_the_new(folders, dense, tmp_path):
    out = tmp_path / "idx"
    shutil.copytree(folders["added"], out)
    before = snapshot(out)
    sparse = FakeSparseEncoder()
    again = add_to_kinds(out, TEXTS[A:B], [dense, sparse, FakeMultiVectorEncoder()], ids=IDS[A:B])
    assert (again.added, again.held, again.rows, again.changed) == (0, B - A, B, False)
    assert sparse.calls == 0 and snapshot(out) == before  # nothing encoded, nothing written
    union = add_to_kinds(out, TEXTS[:A] + TEXTS[B:], [dense, sparse, FakeMultiVectorEncoder()],
                         ids=IDS[:A] + IDS[B:])  # fmt: skip
    assert (union.added, union.held, union.rows) == (len(TEXTS) - B, A, len(TEXTS))
    assert union.kinds["sparse"] == (B, len(TEXTS)) and union.kinds["bm25"] == (B, len(TEXTS))
    assert sparse.calls == 1  # the 10 new texts: one chunk
    store, record = collection.open_texts(out)
    assert store.all() == (IDS, TEXTS) and record["rows"] == len(TEXTS)
    # add_to_index on a folder of kinds is this add; without ids a text is told by its text.
    dup = add_to_index(out, TEXTS[95:] + ["w1 w2 w63"], models(dense))
    assert (dup.added, dup.held) == (1, 5)
    assert collection.open_texts(out)[0].all()[0][-1] == str(len(TEXTS))  # its row number


def test_refusals_come_before_any_work(folders, dense, tmp_path):
    out = tmp_path / "idx"
    shutil.copytree(folders["a"], out)
    before = snapshot(out)
    new = (TEXTS[A:B],)
    with pytest.raises(ValueError, match="holds a multivector index: give its multivector model"):
        add_to_kinds(out, *new, [dense, FakeSparseEncoder()], ids=IDS[A:B])
    with pytest.raises(ValueError, match="a sparse index needs a sparse model, got a multivector"):
        add_to_kinds(out, *new, {"dense": dense, "sparse": FakeMultiVectorEncoder(),
                                 "multivector": FakeMultiVectorEncoder()})  # fmt: skip
    with pytest.raises(ValueError, match="differs in revision"):
        add_to_kinds(out, *new, [dense, FakeSparseEncoder(seed=3), FakeMultiVectorEncoder()])
    with pytest.raises(ValueError, match="texts is empty"):
        add_to_kinds(out, [], models(dense))
    assert snapshot(out) == before
    only_bm25 = tmp_path / "bm25"
    shutil.copytree(folders["a"] / "bm25", only_bm25 / "bm25")
    shutil.copytree(folders["a"] / "texts", only_bm25 / "texts")
    with pytest.raises(ValueError, match=r"holds no sparse index \(it holds bm25\)"):
        add_to_kinds(only_bm25, *new, [FakeSparseEncoder()])


def _sparse_dying_on(call: int):
    class Dying(FakeSparseEncoder):
        def encode_document(self, texts, **options):
            if self.calls + 1 == call:
                raise Killed
            return super().encode_document(texts, **options)

    return Dying()


# Where the add stops, and the rows each kind holds then (dense, sparse, multivector, bm25).
STOPS = {
    "second kind encoding": (None, [A, A, A, A]),
    "texts store commit": ("commit_texts", [A, A, A, A]),
    "dense commit": (1, [A, A, A, A]),
    "sparse commit": (2, [B, A, A, A]),
    "multivector commit": (3, [B, B, A, A]),
    "bm25 commit": (4, [B, B, B, A]),
}


@pytest.mark.parametrize("stop", list(STOPS))
def test_a_stopped_add_opens_consistently_and_the_same_add_finishes_it(
    stop, folders, dense, tmp_path, monkeypatch
):
    out = tmp_path / "idx"
    shutil.copytree(folders["a"], out)
    where, rows = STOPS[stop]
    sparse = FakeSparseEncoder()
    if where is None:
        sparse = _sparse_dying_on(2)  # one of B's two chunks committed
    elif where == "commit_texts":
        monkeypatch.setattr(collection, "commit_texts", _raise)
    else:
        commit, calls = layout.commit, []

        def dying(*args):
            calls.append(args)
            if len(calls) == where:
                raise Killed
            commit(*args)

        monkeypatch.setattr(layout, "commit", dying)
    with pytest.raises(Killed):
        add_to_kinds(out, TEXTS[A:B], [dense, sparse, FakeMultiVectorEncoder()], ids=IDS[A:B])
    monkeypatch.undo()
    kinds = ("dense", "sparse", "multivector", "bm25")
    readers = zip(kinds, [*models(dense), None], strict=True)
    opened = [open_kind_index(out, kind, model) for kind, model in readers]
    assert [index.rows for index in opened] == rows  # each kind opens on its own
    if len(set(rows)) == 1:  # every kind at the old rows: the folder is the one before the add
        assert_same_results(results(out, dense), results(folders["a"], dense))
    else:
        held = ", ".join(f"{k} {r}" for k, r in zip(kinds, rows, strict=True))
        with pytest.raises(KindsDisagreeError, match=f"hold different rows \\({held}; its texts"):
            HybridIndex.open(out, models(dense))
    sparse = FakeSparseEncoder()
    chunks = []
    again = add_to_kinds(
        out, TEXTS[A:B], [dense, sparse, FakeMultiVectorEncoder()], ids=IDS[A:B],
        on_chunk=lambda index, reused: chunks.append(reused),
    )  # fmt: skip
    assert again.rows == B and all(after == B for _, after in again.kinds.values())
    assert again.added == (B - A if where in (None, "commit_texts") else 0)
    # Only what the stopped add had not committed is encoded again: B is two chunks a kind.
    lagging = [k for k, r in zip(kinds, rows, strict=True) if r == A and k != "bm25"]
    if where is None:  # dense's chunks and sparse's first were committed; multivector's not
        assert (sparse.calls, chunks) == (1, [True, True, True, False, False, False])
    else:
        assert (sparse.calls, chunks) == (0, [True] * 2 * len(lagging))
    assert_same_results(results(out, dense), results(folders["added"], dense))
    assert collection.open_texts(out)[1] == collection.open_texts(folders["added"])[1]
    assert not [p for p in out.rglob("*") if ".tmp" in p.name or p.name.startswith("chunk-")]


def _raise(*args):
    raise Killed


# An add to the folder argv[1] with the dense model argv[2], SIGKILLed on the argv[4]th call
# of argv[3] ("module:attribute").
SCRIPT = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
from tests.add_kinds_helpers import A, B, IDS, TEXTS, models
from clearformer import TextEncoder
from clearformer.index import add_to_kinds
out, model, target, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
{DIE_ON_CALL}
add_to_kinds(out, TEXTS[A:B], models(TextEncoder.from_pretrained(model)), ids=IDS[A:B])
"""


def test_an_add_killed_between_two_commits_is_finished_by_the_same_add(folders, dense, tmp_path):
    out = tmp_path / "idx"
    shutil.copytree(folders["a"], out)
    target = "clearformer.index.layout:commit"
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(out), str(dense.path), target, "3"],
        env=env(), capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == -signal.SIGKILL, result.stderr
    with pytest.raises(KindsDisagreeError, match="dense 90, sparse 90, multivector 60, bm25 60"):
        HybridIndex.open(out, models(dense))
    again = add_to_kinds(out, TEXTS[A:B], models(dense), ids=IDS[A:B])
    assert again.added == 0 and again.kinds["multivector"] == (A, B)
    assert again.kinds["sparse"] == (B, B)
    assert_same_results(results(out, dense), results(folders["added"], dense))
    assert not [p for p in out.rglob("*") if ".tmp" in p.name]


def test_an_add_past_the_exact_mark_gives_the_multivector_kind_its_graph(
    tmp_path, dense, monkeypatch
):
    """A multi-vector kind built at ann "auto" under the exact-scan mark scans its encodings;
    the add that takes it past the mark builds the graph over every encoding, as a build of
    all the texts in one go does (it stayed an exact scan, however large it grew)."""
    from clearformer.index import options

    monkeypatch.setattr(options, "EXACT_MAX_ROWS", A)  # A rows: exact; A + B: graph
    build_all(tmp_path / "a", TEXTS[:A], IDS[:A], dense)
    assert open_kind_index(tmp_path / "a", "multivector")._graph is None
    add_to_kinds(tmp_path / "a", TEXTS[A:B], models(dense), ids=IDS[A:B])
    build_all(tmp_path / "whole", TEXTS[:B], IDS[:B], dense)
    added, whole = (open_kind_index(tmp_path / f, "multivector") for f in ("a", "whole"))
    assert added._graph is not None and whole._graph is not None
    assert added.meta["options"]["ann"] == "auto"
    assert_same_results(results(tmp_path / "a", dense), results(tmp_path / "whole", dense))


def test_a_hybrid_open_between_an_adds_commits_waits_for_the_rest(folders, dense, monkeypatch,
                                                                   tmp_path):  # fmt: skip
    # docs/index.md: "a reader never sees half of anything". A reader that opens the folder
    # after the add committed its dense kind, and before its other kinds, sees every kind at
    # the new rows once the add is done, not an error telling it to run the add again.
    import threading
    import time

    out = tmp_path / "idx"
    shutil.copytree(folders["a"], out)
    commit = layout.commit
    reader: dict = {}

    def open_hybrid():
        try:
            reader["index"] = HybridIndex.open(out, models(dense))
        except Exception as exc:  # noqa: BLE001 -- reported by the assertion below
            reader["error"] = exc

    def commit_then_open(*args):
        commit(*args)
        if "thread" not in reader:  # the first kind's commit: dense
            reader["thread"] = threading.Thread(target=open_hybrid)
            reader["thread"].start()
            time.sleep(0.3)  # the reader opens now, between the kinds' commits

    monkeypatch.setattr(layout, "commit", commit_then_open)
    add_to_kinds(out, TEXTS[A:B], models(dense), ids=IDS[A:B])
    reader["thread"].join()
    assert "error" not in reader, reader.get("error")
    assert reader["index"].rows == B
