"""Every file of a sparse, multi-vector and BM25 sub-index and of the shared texts store,
damaged (cut short, its header overwritten, removed): opening the kind is one
IndexDamagedError naming that file, and the CLI says it in one line; the same build again
repairs it."""

from __future__ import annotations

import shutil

import pytest

from clearformer.index import (
    IndexDamagedError,
    KindNotFoundError,
    MultiVectorOptions,
    SparseOptions,
    build_index,
    layout,
    open_kind_index,
)

from .hybrid_helpers import FakeMultiVectorEncoder, FakeSparseEncoder, word_corpus
from .index_helpers import cli

pytest.importorskip("usearch")
pytest.importorskip("bm25s")

TEXTS = word_corpus(80, seed=6)
ENCODERS = {"sparse": FakeSparseEncoder(), "multivector": FakeMultiVectorEncoder(), "bm25": None}
OPTIONS = {
    "sparse": SparseOptions(chunk_rows=32),
    "multivector": MultiVectorOptions(ann="hnsw", chunk_rows=32),
    "bm25": None,
}


def build_all(out):
    for kind, encoder in ENCODERS.items():
        build_index(out, TEXTS, encoder, kind=kind, options=OPTIONS[kind])


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    out = tmp_path_factory.mktemp("damage") / "idx"
    build_all(out)
    return out


def kind_files(root, kind):
    sub = root / kind
    generation = layout.current_generation(sub)
    folder = layout.generation_dir(sub, generation)
    return [sub / layout.CURRENT, folder / layout.META] + sorted(
        p for p in folder.iterdir() if p.name != layout.META
    )


def cases(root):
    out = []
    for kind in ENCODERS:
        out += [(kind, path.relative_to(root)) for path in kind_files(root, kind)]
        out += [(kind, p.relative_to(root)) for p in sorted((root / "texts").iterdir())]
    return out


def damage(path, how):
    data = path.read_bytes()
    if how == "removed":
        path.unlink()
    elif how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    else:  # the first bytes overwritten: headers, magic numbers, JSON
        path.write_bytes(b"\x93garbage-garbage-garbage-garbage" + data[32:])


def test_every_file_is_listed(pristine):
    """The files the damage tests cover are all the files a kind consists of."""
    for kind in ENCODERS:
        generation = layout.current_generation(pristine / kind)
        folder = layout.generation_dir(pristine / kind, generation)
        meta = layout.read_json(folder / layout.META)
        assert sorted(meta["files"]) == sorted(
            p.name for p in folder.iterdir() if p.name != "meta.json"
        )
    assert sorted(p.name for p in (pristine / "multivector" / "generations").glob("*/*")) == [
        "fde.npy", "fde.usearch", "meta.json", "token_indptr.npy", "tokens.npy",
    ]  # fmt: skip


@pytest.mark.parametrize("how", ["removed", "truncated", "garbage"])
def test_damaged_files_are_named_and_the_same_build_repairs(pristine, tmp_path, how):
    for kind, relative in cases(pristine):
        root = tmp_path / f"{kind}-{relative.name}"
        shutil.copytree(pristine, root)
        path = root / relative
        damage(path, how)
        with pytest.raises((IndexDamagedError, KindNotFoundError)) as caught:
            open_kind_index(root, kind, ENCODERS[kind])
        message = str(caught.value)
        if isinstance(caught.value, KindNotFoundError):  # CURRENT removed: nothing committed
            assert path.name == layout.CURRENT and f"holds no {kind} index" in message
        else:
            assert str(path) in message, (kind, relative, how, message)
        build_all(root)  # the same build again repairs it
        assert open_kind_index(root, kind, ENCODERS[kind]).rows == len(TEXTS)
        shutil.rmtree(root)


def test_cli_names_the_damaged_file_in_one_line(pristine, tmp_path):
    root = tmp_path / "idx"
    shutil.copytree(pristine, root)
    victim = next(
        p for p in kind_files(root, "bm25") if p.name.endswith(".json") and p.name != "meta.json"
    )
    damage(victim, "truncated")
    result = cli("search", "w1 w2", "--index", str(root), "--mode", "bm25")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(victim) in lines[0] and "damaged" in lines[0]


def test_a_damaged_seismic_file_is_named(tmp_path):
    pytest.importorskip("seismic")
    root = tmp_path / "idx"
    options = SparseOptions(chunk_rows=32, engine="seismic")
    index = build_index(root, TEXTS, FakeSparseEncoder(), kind="sparse", options=options)
    path = index.folder / "sparse.index.seismic"
    for how in ("removed", "truncated"):
        backup = path.read_bytes()
        damage(path, how)
        with pytest.raises(IndexDamagedError, match=str(path)):
            open_kind_index(root, "sparse", FakeSparseEncoder())
        path.write_bytes(backup)
    assert open_kind_index(root, "sparse", FakeSparseEncoder()).rows == len(TEXTS)


@pytest.mark.parametrize(
    "record",
    [{}, {"shape": 17, "dtype": "<f4"}, {"shape": [3, -1], "dtype": "<f4"}, {"shape": [3]},
     {"bytes": "12"}, {"bytes": 12, "sha256": "no"}],
)  # fmt: skip
def test_a_file_record_of_the_wrong_form_names_meta_json(pristine, tmp_path, record):
    # Valid JSON that lists a file with a record of the wrong form: meta.json is named, in
    # one line, for every kind (it was a KeyError or a TypeError naming nothing).
    import json

    for kind in ENCODERS:
        root = tmp_path / kind
        shutil.copytree(pristine, root)
        meta_path = kind_files(root, kind)[1]
        meta = json.loads(meta_path.read_text())
        meta["files"][sorted(meta["files"])[0]] = record
        meta_path.write_text(json.dumps(meta))
        with pytest.raises(IndexDamagedError, match="records file") as caught:
            open_kind_index(root, kind, ENCODERS[kind])
        assert str(meta_path) in str(caught.value)
        shutil.rmtree(root)
