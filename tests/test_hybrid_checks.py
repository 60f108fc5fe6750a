"""What a hybrid search checks before any work: ``k`` in every mode (Python), and on the command
line each flag named in its own refusal: ``--kinds`` (a kind the index lacks, an empty list),
``--rrf-k``, ``--weights``, and a model flag for a kind the search does not search."""

from __future__ import annotations

import pytest

from clearformer.index import Fusion, HybridIndex, SparseOptions, build_index

from .hybrid_helpers import FakeSparseEncoder, word_corpus
from .index_helpers import cli

pytest.importorskip("bm25s")

TEXTS = word_corpus(50, seed=2)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("hybrid-checks") / "idx"
    build_index(out, TEXTS, FakeSparseEncoder(), kind="sparse",
                options=SparseOptions(chunk_rows=16))  # fmt: skip
    build_index(out, TEXTS, kind="bm25")
    return out


@pytest.mark.parametrize("mode", ["sparse", "bm25", "hybrid"])
@pytest.mark.parametrize("k", [-1, 0, True, 2.5, "3"])
def test_k_is_checked_in_every_mode_before_any_kind_searches(folder, mode, k):
    index = HybridIndex.open(folder, [FakeSparseEncoder()])
    searched = []
    for kind, opened in index.indexes.items():
        search = opened.search
        opened.search = lambda *a, kind=kind, search=search, **o: (
            searched.append(kind) or search(*a, **o)
        )
    with pytest.raises(ValueError, match="k must be a positive integer"):
        index.search("w1 w2", k=k, mode=mode)
    assert searched == []
    assert len(index.search("w1 w2", k=3, mode=mode)) == 3  # a valid k still searches


@pytest.mark.parametrize("kind", ["sparse", "bm25"])
def test_a_kind_searched_alone_gives_every_row_once_for_a_k_far_above_its_rows(folder, kind):
    index = HybridIndex.open(folder, [FakeSparseEncoder()]).indexes[kind]
    hits = index.search("w1 w2", k=10**11)  # result arrays of k rows would be GiBs
    assert 0 < len(hits) == len({hit.id for hit in hits}) <= len(TEXTS)


def test_depth_kinds_and_fusion_are_checked_before_any_kind_searches(folder):
    index = HybridIndex.open(folder, [FakeSparseEncoder()])
    for depth in (0, -5, "x", True):
        with pytest.raises(ValueError, match="depth must be a positive integer"):
            index.search("w1 w2", depth=depth)
    with pytest.raises(ValueError, match="kinds must be a list of kinds, got the string 'bm25'"):
        index.search("w1 w2", kinds="bm25")
    # A single kind's search fuses nothing: kinds and fusion given with it are refused, not
    # ignored.
    with pytest.raises(ValueError, match="kinds applies to mode='hybrid'"):
        index.search("w1 w2", mode="bm25", kinds=["sparse"])
    with pytest.raises(ValueError, match="fusion applies to mode='hybrid'"):
        index.search("w1 w2", mode="bm25", fusion=Fusion("weighted"))


def test_a_kind_missing_from_kinds_is_named_in_python(folder):
    index = HybridIndex.open(folder, [FakeSparseEncoder()], kinds=["bm25"])
    with pytest.raises(ValueError, match=r"^kinds: index .* holds no sparse index"):
        index.search("w1", mode="hybrid", kinds=["bm25", "sparse"])


def refused(folder, *flags):
    result = cli("search", "w1 w2", "--index", str(folder), *flags)
    assert result.returncode == 2, result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


@pytest.fixture(scope="module")
def bm25_only(tmp_path_factory):
    out = tmp_path_factory.mktemp("bm25-only") / "idx"
    build_index(out, TEXTS, kind="bm25")
    return out


def test_a_kind_missing_from_kinds_names_kinds(bm25_only):
    line = refused(bm25_only, "--mode", "hybrid", "--kinds", "bm25,dense")
    assert "--kinds:" in line and "holds no dense index (it holds bm25)" in line
    assert "--mode hybrid:" not in line


@pytest.mark.parametrize("given", [",", " , ", ""])
def test_an_empty_kinds_list_is_refused(bm25_only, given):
    line = refused(bm25_only, "--mode", "hybrid", "--kinds", given)
    assert "--kinds: expected kinds separated by commas" in line and repr(given) in line


def test_a_negative_rrf_k_names_rrf_k(bm25_only):
    line = refused(bm25_only, "--mode", "hybrid", "--rrf-k", "-5")
    assert "--rrf-k must be an integer >= 0, got -5" in line and "--fusion" not in line


def test_a_negative_weight_names_weights(bm25_only):
    line = refused(bm25_only, "--mode", "hybrid", "--fusion", "weighted", "--weights", "bm25=-1")
    assert line.endswith("--weights: bm25's weight must be a finite number >= 0, got -1")


@pytest.mark.parametrize(
    "flags, flag, kind",
    [
        (("--mode", "bm25", "--model", "X"), "--model", "dense"),
        (("--mode", "bm25", "--sparse-model", "/nonexistent"), "--sparse-model", "sparse"),
        (("--mode", "hybrid", "--kinds", "bm25", "--multivector-model", "/nonexistent"),
         "--multivector-model", "multivector"),
        (("--mode", "hybrid", "--kinds", "bm25", "--sparse-model", "/nonexistent"),
         "--sparse-model", "sparse"),
    ],
)  # fmt: skip
def test_a_model_flag_for_a_kind_not_searched_is_refused(folder, flags, flag, kind):
    line = refused(folder, *flags)
    assert f"{flag} applies to the {kind} kind" in line
    assert f"--mode {kind}, or --mode hybrid with {kind} among --kinds" in line


def test_an_empty_list_of_kinds_is_refused_not_read_as_every_kind(folder, tmp_path):
    from clearformer.retrieval import EvalSettings

    message = "kinds must name at least one kind"
    with pytest.raises(ValueError, match=message):
        HybridIndex.open(folder, [FakeSparseEncoder()], kinds=[])
    index = HybridIndex.open(folder, [FakeSparseEncoder()])
    with pytest.raises(ValueError, match=message):
        index.search("w1 w2", k=3, kinds=[])
    assert len(index.search("w1 w2", k=3, kinds=None)) == 3  # None: every kind
    with pytest.raises(ValueError, match=message):
        EvalSettings(mode="hybrid", kinds=())
    done = cli("eval", "--data", str(tmp_path / "none"), "--mode", "hybrid", "--kinds", ",")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .endswith("--kinds must name at least one kind, got ','")
    )
