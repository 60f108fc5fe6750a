"""The vector index: build, search, add (exactly once), storage and dimensions, the model's
identity, readers during writes, and the CLI (``index build | add | info``, ``search --index``).

Most tests run a tiny random checkpoint (width 16), whose embeddings cost nothing; the test that
``search --index`` equals ``search --corpus`` runs the bundled MiniLM on a few texts."""

from __future__ import annotations

import json
import os
import threading

import numpy as np
import pytest

from clearformer.cli import main
from clearformer.index import (
    IndexOptions,
    ModelIdentity,
    ModelMismatchError,
    VectorIndex,
    add_to_index,
    layout,
)
from clearformer.index.quantize import int8_ranges, quantize, truncate
from clearformer.text import TextEncoder

from .helpers import write_tiny_bert
from .index_helpers import WORDS, cli, tiny_model, word_texts

pytest.importorskip("usearch")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return TextEncoder.from_pretrained(tiny_model(tmp_path_factory.mktemp("tiny")))


@pytest.fixture(scope="module")
def texts():
    return word_texts(300)


def exact_top(encoder, corpus, queries, k, dimensions=None):
    """The float32 brute-force top k rows: the truth every storage is held to."""
    x = truncate(encoder.encode(corpus, normalize=True), dimensions)
    q = truncate(encoder.encode(queries, normalize=True), dimensions)
    return np.argsort(-(q @ x.T), axis=1, kind="stable")[:, :k]


@pytest.mark.parametrize("ann", ["exact", "hnsw"])
@pytest.mark.parametrize("storage", ["float32", "int8", "binary"])
def test_every_storage_finds_a_text_first_with_its_own_text_and_id(
    tmp_path, tiny, texts, storage, ann
):
    # 16 bits tell the tiny model's similar vectors apart poorly: binary fetches many
    # candidates here (its recall on real embeddings is test_index_recall's).
    rescore = 100 if storage == "binary" else None
    options = IndexOptions(storage=storage, ann=ann, chunk_rows=64, rescore_multiplier=rescore)
    ids = [f"doc-{i}" for i in range(len(texts))]
    index = tiny.build_index(tmp_path / "idx", texts, ids=ids, options=options)
    assert (index.rows, index.ann, index.dimensions) == (300, ann, 16)
    # Distinct texts only: a repeated short text ties with its copies.
    for row in [i for i in (3, 77, 250) if texts.count(texts[i]) == 1]:
        (hit, *_) = index.search(texts[row], k=3)
        assert (hit.row, hit.id, hit.text) == (row, f"doc-{row}", texts[row])
        assert hit.score == pytest.approx(1.0, abs=1e-5)  # the float32 cosine, always


def test_float32_index_equals_brute_force_and_scores_are_cosines(tmp_path, tiny, texts):
    index = tiny.build_index(tmp_path / "idx", texts, options=IndexOptions(ann="exact"))
    queries = word_texts(20, seed=1)
    rows, scores = index.search_vectors(index.embed_queries(queries), k=10)
    np.testing.assert_array_equal(rows, exact_top(tiny, texts, queries, 10))
    x = truncate(tiny.encode(texts, normalize=True), None)
    q = index.embed_queries(queries)
    np.testing.assert_allclose(scores, np.take_along_axis(q @ x.T, rows, axis=1), atol=1e-6)


def test_quantization_is_sentence_transformers(tmp_path):
    quantization = pytest.importorskip("sentence_transformers.util.quantization")
    rng = np.random.default_rng(0)
    x = truncate(rng.standard_normal((200, 64)).astype(np.float32), None)
    calibration, rest = x[:150], x[150:]
    ranges = int8_ranges(calibration)
    theirs = quantization.quantize_embeddings(rest, "int8", ranges=ranges)
    np.testing.assert_array_equal(quantize(rest, "int8", ranges), theirs)
    theirs = quantization.quantize_embeddings(x, "ubinary")
    np.testing.assert_array_equal(quantize(x, "binary"), theirs)
    signed = quantization.quantize_embeddings(x, "binary")  # the same bits, shifted into int8
    np.testing.assert_array_equal(quantize(x, "binary").astype(np.int16) - 128, signed)


def test_matryoshka_dimensions_truncate_and_renormalise(tmp_path, tiny, texts):
    options = IndexOptions(dimensions=8, ann="exact")
    index = tiny.build_index(tmp_path / "idx", texts, options=options)
    assert index.dimensions == 8
    full = tiny.encode(texts[:5], normalize=True)
    expected = full[:, :8] / np.linalg.norm(full[:, :8], axis=1, keepdims=True)
    np.testing.assert_allclose(index.vectors(np.arange(5)), expected, atol=1e-6)
    queries = word_texts(10, seed=2)
    rows, _ = index.search_vectors(index.embed_queries(queries), k=5)
    np.testing.assert_array_equal(rows, exact_top(tiny, texts, queries, 5, dimensions=8))


def test_memory_and_disk_per_vector(tmp_path, tiny, texts):
    sizes = {}
    for storage in ("float32", "int8", "binary"):
        options = IndexOptions(storage=storage, ann="exact")
        stats = tiny.build_index(tmp_path / storage, texts, options=options).stats()
        assert stats.memory_per_vector == {"float32": 64, "int8": 16, "binary": 2}[storage]
        assert stats.disk_per_vector > 64  # the float32 vectors and the texts stay on disk
        sizes[storage] = stats
    hnsw = tiny.build_index(tmp_path / "hnsw", texts, options=IndexOptions(ann="hnsw")).stats()
    assert hnsw.memory_per_vector > 64  # the graph's links come on top of the vectors


def test_add_is_exactly_once_and_keeps_storage_and_ranges(tmp_path, tiny, texts):
    path = tmp_path / "idx"
    options = IndexOptions(storage="int8", ann="hnsw")
    first = tiny.build_index(path, texts[:200], options=options)
    more = add_to_index(path, texts[200:], tiny)
    assert (more.rows, more.generation, more.options) == (300, "gen-000002", options)
    np.testing.assert_array_equal(more.ranges, first.ranges)  # older vectors stay valid
    again = add_to_index(path, texts[200:], tiny)  # the same texts: already there
    assert (again.rows, again.generation) == (300, "gen-000002")
    rows, _ = more.search_vectors(more.embed_queries([texts[250]]), k=1)
    assert rows[0, 0] == 250 or texts[int(rows[0, 0])] == texts[250]
    # A build replaces the index with its texts alone; the same build again commits nothing.
    rebuilt = tiny.build_index(path, texts[:200], options=options)
    assert (rebuilt.generation, rebuilt.rows) == ("gen-000003", 200)
    assert tiny.build_index(path, texts[:200], options=options).generation == "gen-000003"


def test_add_crossing_the_exact_limit_builds_a_graph(tmp_path, tiny, texts, monkeypatch):
    from clearformer.index import options

    monkeypatch.setattr(options, "EXACT_MAX_ROWS", 250)
    index = tiny.build_index(tmp_path / "idx", texts[:200])
    assert index.ann == "exact"
    index = add_to_index(tmp_path / "idx", texts[200:], tiny)
    assert index.ann == "hnsw"
    rows, _ = index.search_vectors(index.embed_queries(texts[:50]), k=5)
    truth = exact_top(tiny, texts, texts[:50], 5)
    recall = np.mean([len(set(a) & set(b)) / 5 for a, b in zip(rows, truth, strict=True)])
    assert recall >= 0.95


def test_a_search_for_a_large_share_of_the_rows_finds_every_row(tmp_path, tiny, texts):
    # A graph with 2 links a node leaves nodes that no walk reaches: a walk for every row found
    # 29-296 of 300. Searched for a large share of its rows, the index scans instead.
    options = IndexOptions(ann="hnsw", connectivity=2, expansion_add=2)
    index = tiny.build_index(tmp_path / "idx", texts, options=options)
    queries = word_texts(5, seed=3)
    x = truncate(tiny.encode(texts, normalize=True), None)
    for k in (300, 1000, 120):
        rows, scores = index.search_vectors(index.embed_queries(queries), k=k)
        found = min(k, 300)
        assert (rows[:, :found] >= 0).all() and (rows[:, found:] == -1).all()
        for query_rows, query_scores, query in zip(rows, scores, queries, strict=True):
            assert len(set(query_rows[:found])) == found  # distinct rows: every one at k >= 300
            exact = np.sort(x @ index.embed_queries([query])[0])[::-1][:found]
            np.testing.assert_allclose(query_scores[:found], exact, atol=1e-6)
    assert len(index.search(texts[0], k=1000)) == 300
    # A k far above the rows gives every row once, not result arrays of k rows (10^11: GiBs).
    assert len(index.search(texts[0], k=10**11)) == 300
    with pytest.raises(ValueError, match="k must be a positive integer, got 0"):
        index.search(texts[0], k=0)


def test_another_model_is_refused(tmp_path, tiny, texts):
    index_path = tmp_path / "idx"
    tiny.build_index(index_path, texts[:50])
    other_dir = write_tiny_bert(tmp_path / "other", WORDS, n_layers=2)
    other = TextEncoder.from_pretrained(other_dir)
    with pytest.raises(ModelMismatchError, match="differs in revision.*: search with"):
        other.open_index(index_path)
    with pytest.raises(ModelMismatchError, match=r"the model adding texts is .*: add with"):
        add_to_index(index_path, ["w1 w2"], other)
    assert VectorIndex.open(index_path).rows == 50  # nothing was added
    # A copy of the same checkpoint elsewhere is the same model.
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in tiny.path.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    assert TextEncoder.from_pretrained(copy).open_index(index_path).rows == 50


def test_a_dense_module_of_other_weights_is_another_model(tmp_path, tiny, texts):
    # Two sentence-transformers directories alike but for their Dense layer's weights give
    # unrelated vectors: the revision covers each module's weights, not only its config.
    pytest.importorskip("sentence_transformers")
    import shutil

    from .family_helpers import sentence_dir

    def with_dense(name, seed):
        return sentence_dir(tiny.path, tmp_path / name, dense=[(16, 16, True, None)], seed=seed)

    first, drawn_again = with_dense("first", 0), with_dense("drawn-again", 1)
    second = shutil.copytree(first, tmp_path / "second")
    dense_weights = "2_Dense/model.safetensors"
    shutil.copyfile(drawn_again / dense_weights, second / dense_weights)
    first, second = TextEncoder.from_pretrained(first), TextEncoder.from_pretrained(second)
    assert not np.allclose(first.encode(texts[:3]), second.encode(texts[:3]), atol=1e-3)
    assert ModelIdentity.of(first).revision != ModelIdentity.of(second).revision
    first.build_index(tmp_path / "idx", texts[:20])
    with pytest.raises(ModelMismatchError, match="differs in revision"):
        second.open_index(tmp_path / "idx")


@pytest.mark.parametrize("storage", ["float32", "binary"])
def test_a_rebuild_with_another_model_holds_that_models_vectors(tmp_path, tiny, texts, storage):
    """The same texts built again with another model: the segment the first build left (the
    previous generation's) must not be taken for the new one's."""
    from clearformer.index import build_index

    index_path = tmp_path / "idx"
    options = IndexOptions(storage=storage)
    build_index(index_path, texts[:40], tiny, options=options)
    other = TextEncoder.from_pretrained(write_tiny_bert(tmp_path / "other", WORDS, n_layers=2))
    index = build_index(index_path, texts[:40], other, options=options)
    expected = other.encode(texts[:40], normalize=True)
    np.testing.assert_allclose(index.vectors(np.arange(40)), expected, atol=1e-6)
    assert index.identity.revision == VectorIndex.open(index_path, other).identity.revision


def test_default_ids_follow_the_rows_when_a_segment_comes_back(tmp_path, tiny):
    """Texts built first (ids 0, 1), replaced, then added after three others: their ids are
    their new row numbers (3, 4), not those of the segment the first build left."""
    from clearformer.index import build_index

    index_path = tmp_path / "idx"
    build_index(index_path, ["w1 w2", "w3 w4"], tiny)
    build_index(index_path, ["w5", "w6", "w7"], tiny)
    index = add_to_index(index_path, ["w1 w2", "w3 w4"], tiny)
    hits = index.hits(np.array([[3, 4]]), np.zeros((1, 2), dtype=np.float32))[0]
    assert [(h.id, h.text) for h in hits] == [("3", "w1 w2"), ("4", "w3 w4")]


def test_a_reader_keeps_its_generation_while_a_writer_commits(tmp_path, tiny, texts):
    path = tmp_path / "idx"
    tiny.build_index(path, texts[:100], options=IndexOptions(ann="hnsw"))
    reader = VectorIndex.open(path, tiny)
    queries = reader.embed_queries(texts[:20])
    before = reader.search_vectors(queries, k=5)
    hits_before = reader.search(texts[:20], k=5)
    failures = []

    def search_repeatedly():
        for _ in range(30):
            try:
                rows, _ = VectorIndex.open(path, tiny).search_vectors(queries, k=5)
                assert rows.min() >= 0
            except Exception as exc:  # noqa: BLE001 -- collected for the assertion below
                failures.append(exc)

    thread = threading.Thread(target=search_repeatedly)
    thread.start()
    for part in range(3):  # three commits, so the first generation is removed meanwhile
        add_to_index(path, texts[100 + 50 * part : 150 + 50 * part], tiny)
    thread.join()
    assert not failures
    after = reader.search_vectors(queries, k=5)  # the old object still reads its generation
    np.testing.assert_array_equal(before[0], after[0])
    assert reader.search(texts[:20], k=5) == hits_before
    assert sorted(p.name for p in (path / "generations").iterdir()) == ["gen-000003", "gen-000004"]


def test_a_reader_keeps_its_texts_after_rebuilds_remove_their_files(tmp_path, tiny, texts):
    # Two rebuilds of other texts: the reader's segment (and its texts database) is no longer
    # in any kept generation and is removed; the reader still answers with its own texts.
    path = tmp_path / "idx"
    reader = tiny.build_index(path, texts[:30])
    hits_before = reader.search(texts[:5], k=3)
    for n in (31, 32):
        tiny.build_index(path, texts[:n])
    assert not (path / "segments" / reader.meta["segments"][0]["name"]).exists()
    assert reader.search(texts[:5], k=3) == hits_before


def test_a_second_writer_is_refused_while_one_holds_the_lock(tmp_path, tiny, texts):
    path = tmp_path / "idx"
    tiny.build_index(path, texts[:20])
    with layout.writer_lock(path), pytest.raises(layout.IndexBusyError, match="another build"):
        add_to_index(path, texts[20:40], tiny)


def test_a_lock_file_removed_while_a_writer_holds_it_still_excludes_a_second(tmp_path):
    # docs/index.md: ".lock holds nothing: it may be removed". A lock belongs to a file, not
    # to its name: a second writer would make and lock a new .lock, and two writers would
    # clear each other's staging and segments.
    path = tmp_path / "idx"
    with layout.writer_lock(path):
        (path / ".lock").unlink()
        busy = pytest.raises(layout.IndexBusyError, match="another build")
        with busy, layout.writer_lock(path):
            pass
    with layout.writer_lock(path):  # released with the first writer
        pass


def test_bad_arguments_fail_before_any_work(tmp_path, tiny):
    with pytest.raises(ValueError, match="storage must be one of"):
        IndexOptions(storage="int4")
    with pytest.raises(ValueError, match="multiple of 8"):
        IndexOptions(storage="binary", dimensions=12)
    with pytest.raises(ValueError, match="at most the model's width 16"):
        tiny.build_index(tmp_path / "idx", ["w1"], options=IndexOptions(dimensions=32))
    with pytest.raises(ValueError, match="texts is empty"):
        tiny.build_index(tmp_path / "idx", [])
    with pytest.raises(ValueError, match="one per text"):
        tiny.build_index(tmp_path / "idx", ["w1", "w2"], ids=["a"])
    assert not (tmp_path / "idx" / "CURRENT").exists()


# ---- the command line ------------------------------------------------------------------


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_build_add_info_and_search(tmp_path, capsys, tiny, texts):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(texts[:100]) + "\n\n", encoding="utf-8")
    more = tmp_path / "more.jsonl"
    more.write_text(
        "".join(json.dumps({"key": f"m{i}", "body": t}) + "\n" for i, t in enumerate(texts[100:])),
        encoding="utf-8",
    )
    index = tmp_path / "idx"
    model = str(tiny.path)
    code, _, err = _run(
        capsys, "index", "build", "--corpus", str(corpus), "--out", str(index), "--model", model,
        "--storage", "int8", "--dimensions", "8",
    )  # fmt: skip
    assert code == 0, err
    assert "built" in err and "100 vectors of 8 dimensions, int8" in err
    # No --model: the index's own model is found from its record.
    code, _, err = _run(
        capsys, "index", "add", str(index), "--corpus", str(more), "--field", "body",
        "--id-field", "key",
    )  # fmt: skip
    assert code == 0, err
    # What the add added, and what the index holds now: two numbers, never one for the other.
    assert "added 200 vectors to" in err and "it holds 300 vectors of 8 dimensions" in err
    code, _, err = _run(capsys, "index", "add", str(index), "--corpus", str(more), "--field",
                        "body", "--id-field", "key")  # fmt: skip
    assert code == 0 and "already holds these texts" in err
    code, out, err = _run(capsys, "index", "info", str(index))
    assert code == 0, err
    assert "300 in 2 segment(s)" in out and "8 dimensions, int8" in out
    code, out, err = _run(capsys, "search", texts[150], "--index", str(index), "-k", "2", "--json")
    assert code == 0, err
    best = json.loads(out.splitlines()[0])
    assert best["text"] == texts[150] and best["id"] == "m50"
    code, out, err = _run(capsys, "search", texts[5], "--index", str(index), "-k", "1")
    assert code == 0 and "corpus.txt:6: " + texts[5] in out


def test_cli_search_embeds_the_query_in_its_precision(tmp_path, capsys, tiny, texts):
    from clearformer.index import build_index

    index = tmp_path / "idx"
    build_index(index, texts[:60], tiny)
    opened = VectorIndex.open(index, tiny)
    scores = {}
    for precision in ("float32", "bf16"):
        argv = ["search", texts[7], "--index", str(index), "-k", "3", "--json"]
        code, out, err = _run(capsys, *argv, "--model", str(tiny.path), "--precision", precision)
        assert code == 0, err
        got = [json.loads(line) for line in out.splitlines()]
        want = opened.search(texts[7], k=3, precision=precision)
        assert [g["id"] for g in got] == [h.id for h in want]
        assert [g["score"] for g in got] == [round(h.score, 6) for h in want]
        scores[precision] = [g["score"] for g in got]
    assert scores["bf16"] != scores["float32"]  # the flag reached the query's embedding


def test_cli_build_shows_its_phases_and_progress_with_rate_and_time_left(tmp_path, tiny, texts):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(texts) + "\n", encoding="utf-8")

    flags = ("--model", str(tiny.path), "--ann", "hnsw", "--chunk-rows", "64")

    def build(out, *more):
        return cli("index", "build", "--corpus", str(corpus), "--out", str(tmp_path / out), *flags,
                   *more)  # fmt: skip

    # stderr is no terminal here: a line per phase (progress lines come every few seconds).
    result = build("idx")
    assert result.returncode == 0, result.stderr
    phases = [line for line in result.stderr.splitlines() if line.startswith("index build: ")]
    assert [line.split()[2] for line in phases] == [
        "embedding", "embedded", "building", "graph", "committed"
    ], phases  # fmt: skip
    # --progress: the line redrawn in place, with the rate and the time left.
    result = build("again", "--progress")
    assert result.returncode == 0, result.stderr
    drawn = result.stderr.split("\r")
    assert any("embedding 300/300 texts" in part and "texts/s" in part for part in drawn)
    assert any("inserting into the graph" in part and "vectors/s" in part for part in drawn)


def test_cli_index_commands_describe_themselves(capsys):
    for action in ("build", "add", "info"):
        with pytest.raises(SystemExit) as stop:
            main(["index", action, "--help"])
        assert stop.value.code == 0
        usage, description = capsys.readouterr().out.split("\n\n")[:2]
        assert description[0].isupper() and len(description.split()) > 12, description


def test_cli_errors_are_one_line(tmp_path, capsys, tiny, texts):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(texts[:20]) + "\n", encoding="utf-8")
    index = tmp_path / "idx"
    code, _, err = _run(capsys, "search", "w1", "--index", str(index))
    assert code == 2 and "does not exist" in err and "Traceback" not in err
    code, _, err = _run(capsys, "search", "w1")
    assert code == 2 and "give --corpus FILE (rank its lines) or --index INDEX" in err
    code, _, err = _run(
        capsys, "index", "build", "--corpus", str(corpus), "--out", str(index), "--storage",
        "binary", "--dimensions", "12", "--model", str(tiny.path),
    )  # fmt: skip
    assert code == 2 and "--dimensions must be a multiple of 8" in err
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("mine")
    code, _, err = _run(capsys, "index", "build", "--corpus", str(corpus), "--out",
                        str(tmp_path / "notes"), "--model", str(tiny.path))  # fmt: skip
    assert code == 2 and "holds no index" in err
    assert _run(capsys, "index", "build", "--corpus", str(corpus), "--out", str(index),
                "--model", str(tiny.path))[0] == 0  # fmt: skip
    other = write_tiny_bert(tmp_path / "other", WORDS, n_layers=2)
    code, _, err = _run(capsys, "search", "w1", "--index", str(index), "--model", str(other))
    assert code == 2 and "was built with" in err and "differs in revision" in err
    code, _, err = _run(capsys, "search", "w1", "--index", str(index), "--field", "x")
    assert code == 2 and "--field applies to --corpus" in err


@pytest.fixture(scope="module")
def minilm():
    try:
        return TextEncoder.from_pretrained()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))


SENTENCES = [
    "A cat sits on the mat.",
    "A kitten rests on a rug.",
    "Stock markets fell sharply today.",
    "The central bank raised interest rates.",
    "He plays the guitar in a band.",
    "The orchestra performed a symphony.",
    "Heavy rain is expected this weekend.",
    "The football team won the cup final.",
    "A new smartphone was launched on Tuesday.",
    "The recipe needs two eggs and some flour.",
    "Parliament passed the new budget.",
    "The dog chased a ball across the park.",
]


@pytest.mark.parametrize("storage", ["float32", "int8"])
def test_search_index_returns_what_search_corpus_returns(tmp_path, capsys, minilm, storage):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    index = tmp_path / "idx"
    code, _, err = _run(capsys, "index", "build", "--corpus", str(corpus), "--out", str(index),
                        "--storage", storage)  # fmt: skip
    assert code == 0, err
    for query in ("a pet on a carpet", "economy and finance", "music"):
        _, brute, _ = _run(capsys, "search", query, "--corpus", str(corpus), "-k", "5", "--json")
        _, indexed, _ = _run(capsys, "search", query, "--index", str(index), "-k", "5", "--json")
        brute = [json.loads(line) for line in brute.splitlines()]
        indexed = [json.loads(line) for line in indexed.splitlines()]
        assert [r["text"] for r in indexed] == [r["text"] for r in brute]
        assert [r["id"] for r in indexed] == [r["id"] for r in brute]  # FILE:LINE, both
        assert [r["id"] for r in indexed] == [f"corpus.txt:{r['line']}" for r in brute]
        np.testing.assert_allclose(
            [r["score"] for r in indexed], [r["score"] for r in brute], atol=2e-6
        )
        # The lines people read: rank, score, id, text, the same from both.
        _, brute, _ = _run(capsys, "search", query, "--corpus", str(corpus), "-k", "5")
        _, indexed, _ = _run(capsys, "search", query, "--index", str(index), "-k", "5")
        shown = lambda out: [line.split(None, 2)[::2] for line in out.splitlines()]  # noqa: E731
        assert shown(indexed) == shown(brute)
        assert shown(brute)[0][1].startswith("corpus.txt:")


def test_the_docs_python_sample_runs(tmp_path, minilm, monkeypatch, capsys):
    import re
    from pathlib import Path

    doc = Path(__file__).resolve().parents[1] / "docs" / "index.md"
    code = re.search(r"```python\n(.*?)```", doc.read_text(encoding="utf-8"), re.S).group(1)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, "docs/index.md", "exec"), namespace)
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].split()[1] == "econ-1" and printed[1].split()[1] == "econ-2"
    assert namespace["index"].rows == 4 and namespace["rows"][0, 0] == 1  # "The striker ..."


@pytest.mark.parametrize("name", ["expansion_search", "rescore_multiplier"])
@pytest.mark.parametrize("value", [1.5, -1, 0, True])
def test_a_search_override_that_is_not_a_positive_integer_is_refused(
    tmp_path, tiny, texts, name, value
):
    index = tiny.build_index(tmp_path / "idx", texts[:30])
    with pytest.raises(ValueError, match=f"{name} must be a positive integer, got {value!r}"):
        index.search(texts[0], k=3, **{name: value})
    assert len(index.search(texts[0], k=3, **{name: 2})) == 3


def test_default_ids_of_an_add_follow_an_add_that_committed_while_it_planned(tmp_path, tiny):
    """An add plans from the index it opened; another add commits before it takes the lock:
    its texts go after that add's rows, and so do their default ids (row numbers)."""
    from clearformer.index import build as build_module
    from clearformer.index import build_index

    index_path = tmp_path / "idx"
    build_index(index_path, ["w1", "w2", "w3"], tiny)
    stale = VectorIndex.open(index_path)  # what the slower add saw
    add_to_index(index_path, ["w4", "w5"], tiny)
    hooks = build_module._Hooks()
    build_module._write(index_path, ["w6 w7"], tiny, None, stale.options, stale, None, hooks, {})
    index = VectorIndex.open(index_path)
    hits = index.hits(np.array([[5]]), np.zeros((1, 1), dtype=np.float32))[0]
    assert index.rows == 6 and (hits[0].id, hits[0].text) == ("5", "w6 w7")


@pytest.mark.parametrize("rebuilt_with", ["another model", "int8 storage"])
def test_an_add_checks_again_a_rebuild_that_committed_before_it_took_the_lock(
    tmp_path, tiny, texts, monkeypatch, rebuilt_with
):
    # The add's checks ran on the index as it was; a rebuild with another model or storage
    # committed before the add took the writer lock. The add must not join its vectors to
    # the rebuilt index (mixing two models, or float32 rows into an int8 segment list).
    from clearformer.index import build, build_index

    root = tmp_path / "idx"
    build_index(root, texts[:30], tiny)
    other = TextEncoder.from_pretrained(write_tiny_bert(tmp_path / "other", WORDS, n_layers=2))
    rebuild = (
        (lambda: build_index(root, texts[:30], other))
        if rebuilt_with == "another model"
        else (lambda: build_index(root, texts[:30], tiny, options=IndexOptions(storage="int8")))
    )
    checked = build._plan

    rebuilt = []

    def plan_then_rebuild(*args, **kwargs):
        plan = checked(*args, **kwargs)
        if not rebuilt:  # the add's plan (the rebuild plans through here too)
            rebuilt.append(True)
            rebuild()  # commits while the add has not taken the lock yet
        return plan

    monkeypatch.setattr(build, "_plan", plan_then_rebuild)
    error = ModelMismatchError if rebuilt_with == "another model" else ValueError
    with pytest.raises(error, match="add"):
        add_to_index(root, texts[30:40], tiny)
    monkeypatch.undo()
    after = VectorIndex.open(root)
    assert after.rows == 30 and after.generation == layout.current_generation(root)
    owner = other if rebuilt_with == "another model" else tiny
    np.testing.assert_allclose(
        after.vectors(np.arange(30)), owner.encode(texts[:30], normalize=True), atol=2e-2
    )


def test_the_prompt_before_each_text_is_part_of_what_an_index_holds(tmp_path, tiny, texts):
    # A prompt changes every vector: a build without it after one with it embeds again (it
    # is not "already held"), and an add with another prompt than the index's is refused.
    pytest.importorskip("sentence_transformers")
    from clearformer.index import build_index

    from .family_helpers import sentence_dir

    prompted = TextEncoder.from_pretrained(
        sentence_dir(tiny.path, tmp_path / "st", prompts={"query": "w1 w2 ", "document": "w3 "})
    )
    root = tmp_path / "idx"
    with_prompt = build_index(root, texts[:20], prompted, prompt_name="document")
    np.testing.assert_allclose(
        with_prompt.vectors(np.arange(20)),
        prompted.encode(texts[:20], normalize=True, prompt_name="document"),
        atol=1e-6,
    )
    with pytest.raises(ValueError, match=r"the prompt must be 'w3 ' for an add .* got None"):
        add_to_index(root, texts[20:25], prompted)
    without = build_index(root, texts[:20], prompted)
    assert without.generation != with_prompt.generation
    np.testing.assert_allclose(
        without.vectors(np.arange(20)), prompted.encode(texts[:20], normalize=True), atol=1e-6
    )
    added = add_to_index(root, texts[20:25], prompted)
    assert added.rows == 25
