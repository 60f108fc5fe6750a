"""Every file a committed index consists of, damaged every way: truncated, overwritten with
garbage, removed, or replaced by a whole, well-formed file with other row counts (the same
file of a smaller index of the same model and options). ``clearformer search --index`` and
``clearformer index info`` answer each with one error line naming that file, exit status 2,
never a traceback or a result; the same build (and add) run again repairs the index.

The files are the layout module's (``layout.FILE_KINDS``, ``layout.index_files``), and the
first test holds the layout to the directory: a file that an index gains later and the layout
does not list fails it, and one it lists is damaged here like the others."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from clearformer.index import VectorIndex, layout

from .index_helpers import cli, tiny_model, word_texts

pytest.importorskip("usearch")

DAMAGES = ("truncated", "garbage", "removed", "wrong rows")
QUERY = "w3 w7 w11"


def build_commands(setup, kind: str, out, rows: int | None = None) -> list[tuple[str, ...]]:
    """The CLI commands that make the ``kind`` index at ``out`` (of its first ``rows`` texts)."""
    model, first, second, small = setup["model"], setup["first"], setup["second"], setup["small"]
    if kind == "graph":  # a graph over int8 vectors, in two segments: a build and an add
        flags = ("--ann", "hnsw", "--storage", "int8")
        if rows is not None:
            return [("index", "build", "--corpus", str(small), "--out", str(out), *flags,
                     "--model", str(model))]  # fmt: skip
        return [
            ("index", "build", "--corpus", str(first), "--out", str(out), *flags,
             "--chunk-rows", "64", "--model", str(model)),
            ("index", "add", str(out), "--corpus", str(second), "--model", str(model)),
        ]  # fmt: skip
    flags = ("--ann", "exact", "--storage", "binary")  # an exact scan of packed bits
    corpus = small if rows is not None else setup["whole"]
    return [("index", "build", "--corpus", str(corpus), "--out", str(out), *flags,
             "--chunk-rows", "64", "--model", str(model))]  # fmt: skip


def run_all(commands) -> None:
    for command in commands:
        result = cli(*command)
        assert result.returncode == 0, result.stderr


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("damage")
    texts = word_texts(300)
    paths = {"model": tiny_model(root / "model")}
    for name, part in [("first", texts[:150]), ("second", texts[150:]), ("whole", texts),
                       ("small", texts[:60])]:  # fmt: skip
        paths[name] = root / f"{name}.txt"
        paths[name].write_text("\n".join(part) + "\n", encoding="utf-8")
    for kind in ("graph", "scan"):
        run_all(build_commands(paths, kind, root / kind))
        run_all(build_commands(paths, kind, root / f"{kind}-small", rows=60))
        paths[kind] = root / kind
        paths[f"{kind}-small"] = root / f"{kind}-small"
    return paths


def files_of(root):
    """The committed generation's files, from the layout module."""
    generation = layout.current_generation(root)
    meta = layout.read_json(layout.generation_dir(root, generation) / layout.META)
    return layout.index_files(root, generation, meta)


def target(root, kind: str):
    """The file of kind ``kind`` in ``root`` that the damage goes to: the last segment's (the
    added one, at an offset, in the graph index)."""
    found = [path for path in files_of(root) if path.name == kind]
    return found[-1] if found else None


def cases():
    for index in ("graph", "scan"):
        for kind in layout.FILE_KINDS:
            if index == "scan" and kind == layout.GRAPH:
                continue  # an exact index has no graph
            for damage in DAMAGES:
                if kind == layout.CURRENT and damage == "wrong rows":
                    continue  # it holds a name, not rows (a name of no generation: "garbage")
                yield index, kind, damage


def damage_file(path, damage: str, setup, index: str) -> None:
    rng = np.random.default_rng(0)
    if damage == "removed":
        path.unlink()
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif damage == "garbage":
        path.write_bytes(rng.integers(0, 256, path.stat().st_size, dtype=np.uint8).tobytes())
    elif path.name == layout.META:  # rows consistent within meta.json, not with the files
        meta = json.loads(path.read_text(encoding="utf-8"))
        meta["rows"] -= 10
        meta["segments"][-1]["rows"] -= 10
        path.write_text(json.dumps(meta), encoding="utf-8")
    else:  # the same file of a 60-row index of the same model and options
        shutil.copyfile(target(setup[f"{index}-small"], path.name), path)


def test_the_layout_lists_every_file_of_an_index(setup):
    for index in ("graph", "scan"):
        root = setup[index]
        on_disk = {p for p in root.rglob("*") if p.is_file() and p.name != ".lock"}
        listed = set(files_of(root))
        assert listed <= on_disk
        # Beside the current generation's files, only the previous generation's (kept for
        # readers that opened it before the last commit), which the layout lists too.
        current = layout.generation_dir(root, layout.current_generation(root))
        previous = layout.read_json(current / layout.META)["previous"]
        if previous is not None:
            meta = layout.read_json(layout.generation_dir(root, previous) / layout.META)
            listed |= set(layout.index_files(root, previous, meta))
        assert on_disk == listed, on_disk ^ listed
        assert {p.name for p in on_disk} <= set(layout.FILE_KINDS)
    assert {p.name for p in files_of(setup["graph"])} == set(layout.FILE_KINDS)


@pytest.mark.parametrize(("index", "kind", "damage"), list(cases()))
def test_a_damaged_file_is_one_error_line_naming_it(tmp_path, setup, index, kind, damage):
    root = tmp_path / "idx"
    shutil.copytree(setup[index], root)
    path = target(root, kind)
    damage_file(path, damage, setup, index)
    model = str(setup["model"])
    for command in (
        ("search", QUERY, "--index", str(root), "--model", model, "-k", "1000"),
        ("index", "info", str(root)),
    ):
        result = cli(*command)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2, (command, result.stdout, result.stderr)
        assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
        assert str(path) in lines[0], lines[0]
        assert result.stdout == ""


@pytest.mark.parametrize(("index", "kind", "damage"), list(cases()))
def test_the_same_build_again_repairs_a_damaged_index(tmp_path, setup, index, kind, damage):
    root = tmp_path / "idx"
    shutil.copytree(setup[index], root)
    damage_file(target(root, kind), damage, setup, index)
    run_all(build_commands(setup, index, root))
    repaired, whole = VectorIndex.open(root), VectorIndex.open(setup[index])
    rows = np.arange(whole.rows)
    np.testing.assert_array_equal(repaired.vectors(rows), whole.vectors(rows))
    texts = lambda index: [(h.id, h.text) for h in index.hits(rows[None], rows[None] * 0.0)[0]]  # noqa: E731
    assert texts(repaired) == texts(whole)
    model = str(setup["model"])
    searched = [cli("search", QUERY, "--index", str(r), "--model", model, "-k", "1000").stdout
                for r in (root, setup[index])]  # fmt: skip
    assert searched[0] == searched[1] and len(searched[0].splitlines()) == 300


def test_the_lock_file_holds_nothing_a_reader_or_writer_needs(tmp_path, setup):
    root = tmp_path / "idx"
    shutil.copytree(setup["graph"], root)
    model = str(setup["model"])
    for damage in ("garbage", "removed"):
        lock = root / ".lock"
        if damage == "garbage":
            lock.write_bytes(b"\xff" * 64)
        else:
            lock.unlink()
        result = cli("search", QUERY, "--index", str(root), "--model", model)
        assert result.returncode == 0 and len(result.stdout.splitlines()) == 5, result.stderr
    run_all(build_commands(setup, "graph", root))  # the writer makes it again
    assert (root / ".lock").is_file()


@pytest.mark.parametrize("name", [layout.VECTORS, layout.TEXTS])
def test_bytes_overwritten_inside_a_file_are_found_when_a_search_reads_them(tmp_path, setup, name):
    # A file that keeps its header and its size passes the checks on open; what a search
    # then reads from it (the rescored vectors, the hits' texts) is checked as it is read.
    root = tmp_path / "idx"
    shutil.copytree(setup["scan"], root)
    path = target(root, name)
    data = bytearray(path.read_bytes())
    start = 128 if name == layout.VECTORS else 4096  # past the .npy header / SQLite's page 1
    data[start:] = np.full(len(data) - start, 0x7F, dtype=np.uint8).tobytes()
    path.write_bytes(bytes(data))
    result = cli("search", QUERY, "--index", str(root), "--model", str(setup["model"]))
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and str(path) in result.stderr


# ---- what a stopped build leaves: its staged chunks --------------------------------------


class Stop(Exception):
    pass


def stopped_build(root, setup, texts, options) -> None:
    """A build that stops (an exception) after committing 3 of its 5 chunks."""
    from clearformer.index import build_index
    from clearformer.text import TextEncoder

    def stop_after_three(index, reused):
        if index == 2:
            raise Stop

    encoder = TextEncoder.from_pretrained(setup["model"])
    with pytest.raises(Stop):
        build_index(root, texts, encoder, options=options, on_chunk=stop_after_three)


def test_a_commit_removes_the_chunks_a_stopped_write_of_other_texts_left(tmp_path, setup):
    """A stopped build leaves its chunks to resume from; a write of other texts that commits
    instead removes them (they would stay on disk indefinitely), and the index is that
    write's alone."""
    from clearformer.index import IndexOptions, build_index
    from clearformer.text import TextEncoder

    options = IndexOptions(ann="exact", chunk_rows=64)
    root = tmp_path / "idx"
    stopped_build(root, setup, word_texts(300), options)
    (left,) = (root / "staging").iterdir()
    assert list(left.glob("chunk-*"))
    other = word_texts(320)[300:]
    encoder = TextEncoder.from_pretrained(setup["model"])
    index = build_index(root, other, encoder, options=options)
    assert index.rows == 20 and not left.exists()
    assert not any((root / "staging").iterdir())


def test_chunks_of_one_precision_are_not_resumed_by_a_write_in_another(tmp_path, setup):
    """A stopped float32 build's chunks are not taken by the same build from an encoder
    loaded in bf16: its index holds bf16 rows throughout, as a clean bf16 build's."""
    from clearformer.index import IndexOptions, build_index
    from clearformer.text import TextEncoder

    texts = word_texts(300)
    options = IndexOptions(ann="exact", chunk_rows=64)
    root = tmp_path / "idx"
    stopped_build(root, setup, texts, options)
    bf16 = TextEncoder.from_pretrained(setup["model"], precision="bf16")
    index = build_index(root, texts, bf16, options=options)
    clean = build_index(tmp_path / "clean", texts, bf16, options=options)
    rows = np.arange(300)
    np.testing.assert_array_equal(index.vectors(rows), clean.vectors(rows))
    float32 = TextEncoder.from_pretrained(setup["model"]).encode(texts[:64], normalize=True)
    assert np.abs(index.vectors(np.arange(64)) - float32).max() > 1e-4  # not the stopped chunks


@pytest.mark.parametrize("damage", [*DAMAGES, "garbage inside"])
def test_a_damaged_chunk_of_a_stopped_build_is_embedded_again(tmp_path, setup, damage):
    from clearformer.index import IndexOptions, build_index
    from clearformer.text import TextEncoder

    texts = word_texts(300)
    options = IndexOptions(ann="exact", chunk_rows=64)
    root = tmp_path / "idx"
    stopped_build(root, setup, texts, options)
    (staging,) = (root / "staging").iterdir()
    chunk = staging / "chunk-000001.npy"
    if damage == "wrong rows":  # a whole file of unit rows, 30 of them where 64 belong
        rows = np.random.default_rng(0).standard_normal((30, 16)).astype(np.float32)
        np.save(chunk, rows / np.linalg.norm(rows, axis=1, keepdims=True))
    elif damage == "garbage inside":  # the header and size kept
        data = bytearray(chunk.read_bytes())
        data[128:] = b"\x7f" * (len(data) - 128)
        chunk.write_bytes(bytes(data))
    else:
        damage_file(chunk, damage, setup, "scan")
    encoder = TextEncoder.from_pretrained(setup["model"])
    index = build_index(root, texts, encoder, options=options)
    clean = build_index(tmp_path / "clean", texts, encoder, options=options)
    rows = np.arange(300)
    np.testing.assert_array_equal(index.vectors(rows), clean.vectors(rows))
    assert not (root / "staging").exists() or not any((root / "staging").iterdir())


def test_a_damaged_job_record_of_a_stopped_build_is_one_error_line_naming_it(tmp_path, setup):
    from clearformer.index import IndexOptions

    root = tmp_path / "idx"
    stopped_build(root, setup, word_texts(300), IndexOptions(ann="exact", chunk_rows=64))
    (staging,) = (root / "staging").iterdir()
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(word_texts(300)) + "\n", encoding="utf-8")
    for damage in (b"\xff{", b"[1]"):  # not JSON; JSON but no object
        (staging / "job.json").write_bytes(damage)
        result = cli("index", "build", "--corpus", str(corpus), "--out", str(root), "--ann",
                     "exact", "--chunk-rows", "64", "--model", str(setup["model"]))  # fmt: skip
        assert result.returncode == 2, damage
        lines = result.stderr.strip().splitlines()
        assert str(staging / "job.json") in lines[-1] and "Traceback" not in result.stderr
        assert f"remove {staging}" in lines[-1]


def _bad_storage(meta):
    meta["options"]["storage"] = "bogus"


def _no_revision(meta):
    del meta["model"]["revision"]


def _no_content(meta):
    del meta["segments"][-1]["content"]


@pytest.mark.parametrize("damage", [_bad_storage, _no_revision, _no_content])
def test_a_meta_json_with_a_field_that_does_not_read_is_named_and_repaired(tmp_path, setup, damage):
    """Valid JSON whose fields a rerun compares (the options, the model's revision, a
    segment's content hash) are wrong: one error line naming meta.json, and the same build
    again repairs it (it failed before writing anything, naming no file)."""
    root = tmp_path / "idx"
    shutil.copytree(setup["scan"], root)
    path = target(root, layout.META)
    meta = json.loads(path.read_text(encoding="utf-8"))
    damage(meta)
    path.write_text(json.dumps(meta), encoding="utf-8")
    result = cli("index", "info", str(root))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and str(path) in lines[0], result.stderr
    run_all(build_commands(setup, "scan", root))
    repaired, whole = VectorIndex.open(root), VectorIndex.open(setup["scan"])
    rows = np.arange(whole.rows)
    np.testing.assert_array_equal(repaired.vectors(rows), whole.vectors(rows))
