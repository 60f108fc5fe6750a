"""``clearformer mine`` against a brute-force ranking of the same embeddings: the negatives are
the nearest non-positives within the rank range and margin, never an anchor's own positive; the
corpus index is reused by a rerun; bad settings are refused before any work."""

from __future__ import annotations

import json

import numpy as np
import pytest

from clearformer.retrieval.mining import MiningSettings, mine_hard_negatives

from .contrastive_helpers import write_retrieval_data, write_sentence_transformer
from .faults.conftest import run_cli
from .index_helpers import cli

pytest.importorskip("sentence_transformers")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from clearformer import TextEncoder

    root = tmp_path_factory.mktemp("mine")
    model = write_sentence_transformer(root / "st")
    pairs_file, beir = write_retrieval_data(root / "data", rows=30)
    rows = [json.loads(x) for x in pairs_file.read_text().splitlines()]
    # Two rows share an anchor: both positives are its own, neither may be its negative.
    rows.append({"anchor": rows[0]["anchor"], "positive": rows[7]["positive"]})
    pairs = [(r["anchor"], r["positive"]) for r in rows]
    return TextEncoder.from_pretrained(model), pairs, root, model, beir


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    from .test_sequence_classification import make_classifier

    path = tmp_path_factory.mktemp("reranker")
    make_classifier("bert", path, num_labels=1)
    return path


def _brute_force(encoder, pairs, corpus, precision=None):
    texts = list(dict.fromkeys([*(p for _, p in pairs), *corpus]))
    anchors = list(dict.fromkeys(a for a, _ in pairs))
    docs = encoder.encode(texts, normalize=True, precision=precision)
    queries = encoder.encode(anchors, normalize=True, precision=precision)
    scores = queries @ docs.T  # (anchors, texts)
    return texts, anchors, scores


@pytest.mark.parametrize(
    "settings",
    [
        MiningSettings(negatives=2, range_max=10),
        MiningSettings(negatives=3, range_min=2, range_max=8),
        MiningSettings(negatives=5, range_max=20, absolute_margin=0.05),
    ],
    ids=["top", "range", "margin"],
)
def test_negatives_equal_a_brute_force_ranking(setup, tmp_path, settings):
    encoder, pairs, *_ = setup
    corpus = ["w59 w58 w57", "w1 w2 w3 w4"]
    rows, report = mine_hard_negatives(
        pairs, encoder, tmp_path / "idx", corpus=corpus, settings=settings
    )
    assert [(r["anchor"], r["positive"]) for r in rows] == pairs
    texts, anchors, scores = _brute_force(encoder, pairs, corpus)
    own = {a: {p for b, p in pairs if b == a} for a in anchors}
    for i, anchor in enumerate(anchors):
        order = [texts[j] for j in np.argsort(-scores[i], kind="stable")]
        candidates = [t for t in order if t not in own[anchor]]
        candidates = candidates[settings.range_min : settings.range_max]
        positive = min(scores[i, texts.index(p)] for p in own[anchor])
        if settings.absolute_margin is not None:
            candidates = [
                t
                for t in candidates
                if scores[i, texts.index(t)] <= positive - settings.absolute_margin
            ]
        expected = candidates[: settings.negatives]
        for row in (r for r in rows if r["anchor"] == anchor):
            assert row["negative"] == expected, anchor
            assert not set(row["negative"]) & own[anchor]
    assert report.negatives == sum(len(r["negative"]) for r in rows)


def test_a_precision_embeds_the_corpus_and_the_anchors_and_the_index_records_it(setup, tmp_path):
    from clearformer.index import VectorIndex
    from clearformer.index.recipe import index_precision

    encoder, pairs, *_ = setup
    settings = MiningSettings(negatives=2, range_max=10)
    rows, _ = mine_hard_negatives(pairs, encoder, tmp_path / "idx", settings=settings)
    bf16, _ = mine_hard_negatives(
        pairs, encoder, tmp_path / "idx", settings=settings, precision="bf16"
    )
    assert index_precision(VectorIndex.open(tmp_path / "idx").meta) == "bf16"  # built again
    texts, anchors, scores = _brute_force(encoder, pairs, [], precision="bf16")
    for row in bf16:
        i = anchors.index(row["anchor"])
        own = {p for a, p in pairs if a == row["anchor"]}
        order = [texts[j] for j in np.argsort(-scores[i], kind="stable")]
        assert row["negative"] == [t for t in order if t not in own][:2]
    assert len(rows) == len(bf16)


@pytest.mark.parametrize("precision", [None, "bf16"])
def test_a_cross_encoder_reorders_and_filters_each_anchors_candidates(
    setup, reranker, tmp_path, precision
):
    """The candidates the embeddings found, in the cross-encoder's order, kept where the
    cross-encoder scores them at most the anchor's lowest positive (margin 0), scored in
    ``cross_encoder_precision``: as each anchor's pairs scored on their own give."""
    from clearformer import CrossEncoder

    encoder, pairs, *_ = setup
    cross = CrossEncoder.from_pretrained(reranker)
    pool, _ = mine_hard_negatives(
        pairs, encoder, tmp_path / "idx", settings=MiningSettings(negatives=10, range_max=10)
    )
    rows, report = mine_hard_negatives(
        pairs,
        encoder,
        tmp_path / "idx",
        settings=MiningSettings(negatives=3, range_max=10, absolute_margin=0.0),
        cross_encoder=cross,
        cross_encoder_precision=precision,
    )
    for row, candidates in zip(rows, pool, strict=True):
        anchor, found = row["anchor"], candidates["negative"]
        own = [p for a, p in pairs if a == anchor]
        scores = cross.predict([(anchor, t) for t in found], precision=precision)
        positive = cross.predict([(anchor, p) for p in own], precision=precision).min()
        order = np.argsort(-scores, kind="stable")
        assert row["negative"] == [found[i] for i in order if scores[i] <= positive][:3]
    assert report.dropped["margin"] > 0  # the filter dropped some: the test can fail


def test_rescoring_in_chunks_gives_the_same_rows_and_steady_progress(
    setup, reranker, tmp_path, monkeypatch
):
    from clearformer import CrossEncoder
    from clearformer.retrieval import mining

    encoder, pairs, *_ = setup
    cross = CrossEncoder.from_pretrained(reranker)
    settings = MiningSettings(negatives=3, range_max=10, absolute_margin=0.0)
    whole, _ = mine_hard_negatives(
        pairs, encoder, tmp_path / "idx", settings=settings, cross_encoder=cross
    )
    seen: list[tuple[str, int, int]] = []
    monkeypatch.setattr(mining, "RESCORE_CHUNK", 7)
    chunked, _ = mine_hard_negatives(
        pairs,
        encoder,
        tmp_path / "idx",
        settings=settings,
        cross_encoder=cross,
        progress=lambda *a: seen.append(a),
    )
    assert chunked == whole
    anchors = [done for phase, done, _ in seen if phase == "anchors"]
    assert len(anchors) > 3 and anchors == sorted(anchors)  # several steps, never back
    assert anchors[-1] == seen[-1][2]


def test_cross_encoder_precision_is_checked_before_any_work(setup, reranker, tmp_path):
    from clearformer import CrossEncoder

    encoder, pairs, *_ = setup
    with pytest.raises(ValueError, match="applies with a cross_encoder"):
        mine_hard_negatives(pairs, encoder, tmp_path / "a", cross_encoder_precision="bf16")
    cross = CrossEncoder.from_pretrained(reranker)
    with pytest.raises(ValueError, match="precision must be one of .*got 'int8'"):
        mine_hard_negatives(
            pairs, encoder, tmp_path / "b", cross_encoder=cross, cross_encoder_precision="int8"
        )
    with pytest.raises(ValueError, match="precision must be one of .*got 'int4'"):
        mine_hard_negatives(pairs, encoder, tmp_path / "c", precision="int4")
    from .test_sequence_classification import make_classifier

    make_classifier("bert", tmp_path / "labels", num_labels=2)
    labels = CrossEncoder.from_pretrained(tmp_path / "labels")
    with pytest.raises(ValueError, match="to rescore candidates with, got num_labels=2"):
        mine_hard_negatives(pairs, encoder, tmp_path / "d", cross_encoder=labels)
    assert not any((tmp_path / name).exists() for name in "abcd")


def test_random_sampling_is_seeded_and_draws_from_the_survivors(setup, tmp_path):
    encoder, pairs, *_ = setup
    top, _ = mine_hard_negatives(
        pairs, encoder, tmp_path / "idx", settings=MiningSettings(negatives=10, range_max=10)
    )
    draw = MiningSettings(negatives=2, range_max=10, sampling="random", seed=3)
    a, _ = mine_hard_negatives(pairs, encoder, tmp_path / "idx", settings=draw)
    b, _ = mine_hard_negatives(pairs, encoder, tmp_path / "idx", settings=draw)
    assert a == b
    for row, pool in zip(a, top, strict=True):
        assert set(row["negative"]) <= set(pool["negative"]) and len(row["negative"]) == 2


def test_cli_writes_rows_train_reads_and_reuses_the_index(setup, tmp_path):
    from clearformer.index import VectorIndex
    from clearformer.train.pairs import read_pairs

    _, _, root, model, beir = setup
    out = tmp_path / "mined.jsonl"
    argv = [
        "mine",
        "--data",
        str(beir),
        "--split",
        "dev",
        "--model",
        str(model),
        "--out",
        str(out),
        "-n",
        "2",
        "--no-progress",
    ]
    done = cli(*argv)
    assert done.returncode == 0, done.stderr
    rows = read_pairs(out)  # the training reader takes the file as it is
    assert len(rows) == 30 and all(len(r.negatives) == 2 for r in rows)
    generation = VectorIndex.open(str(out) + ".index").generation
    assert cli(*argv).returncode == 0
    assert VectorIndex.open(str(out) + ".index").generation == generation  # nothing re-embedded


def test_cli_precisions_for_the_encoder_and_the_cross_encoder(setup, reranker, tmp_path):
    from clearformer.index import VectorIndex
    from clearformer.index.recipe import index_precision

    _, _, _, model, beir = setup
    out = tmp_path / "mined.jsonl"
    argv = ["mine", "--data", str(beir), "--split", "dev", "--model", str(model)]
    argv += ["--out", str(out), "-n", "2", "--no-progress", "--precision", "bf16"]
    argv += ["--cross-encoder", str(reranker), "--cross-encoder-precision", "bf16"]
    done = cli(*argv)
    assert done.returncode == 0, done.stderr
    assert index_precision(VectorIndex.open(str(out) + ".index").meta) == "bf16"
    assert len(out.read_text().splitlines()) == 30


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (
            ["--cross-encoder-precision", "bf16"],
            "--cross-encoder-precision applies with --cross-encoder DIR",
        ),
        (["--range-min", "9", "--range-max", "5"], "--range-min must be below"),
        (["--absolute-margin", "-1"], "expected a number >= 0"),
        (["--split", "nope"], "split 'nope' has no qrels"),
        # A NaN bound compares false with every score: it would filter nothing.
        (["--max-score", "nan"], "--max-score must be a number, got nan"),
        (["--min-score", "nan"], "--min-score must be a number, got nan"),
        (["--min-score", "0.5", "--max-score", "0.2"], "--min-score must be at most --max-score"),
        # Ranks 48 and 49 are the only candidates: five negatives could never be found.
        (
            ["-n", "5", "--range-min", "48"],
            "--negatives must be at most --range-max - --range-min = 2, got 5",
        ),
    ],
)
def test_bad_settings_are_one_line_errors_before_any_work(setup, tmp_path, flags, fragment):
    _, _, _, model, beir = setup
    out = tmp_path / "mined.jsonl"
    done = run_cli("mine", "--data", str(beir), "--model", str(model), "--out", str(out), *flags)
    assert done.returncode == 2 and fragment in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not out.exists() and not (tmp_path / "mined.jsonl.index").exists()


def test_an_anchor_in_the_corpus_is_never_its_own_negative(setup, tmp_path):
    from clearformer.train.pairs import read_pairs

    encoder, pairs, *_ = setup
    anchors = list(dict.fromkeys(a for a, _ in pairs))
    # Every anchor's text is a corpus text too: the nearest of all to it (score 1).
    rows, report = mine_hard_negatives(
        pairs,
        encoder,
        tmp_path / "idx",
        corpus=anchors,
        settings=MiningSettings(negatives=3, range_max=10),
    )
    assert all(r["anchor"] not in r["negative"] for r in rows)
    assert all(len(r["negative"]) == 3 for r in rows)  # the range is still filled
    assert report.dropped["anchor"] == len(anchors)
    # ... and train reads the rows (it refuses one whose anchor is among its negatives).
    path = tmp_path / "mined.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert len(read_pairs(path)) == len(rows)


@pytest.mark.parametrize(
    ("positive", "close"),
    [
        # A cross-encoder's logit: 5 % of |-2.0| below it is -2.1; -1.95 is above the positive
        # (positive x 0.95 = -1.9 would have kept it).
        (-2.0, -1.95),
        (0.8, 0.78),  # a positive score: 0.76, as before
    ],
)
def test_relative_margin_keeps_only_candidates_below_the_positive(positive, close):
    import random

    from clearformer.retrieval.mining import MiningReport, _filter

    settings = MiningSettings(negatives=3, relative_margin=0.05)
    report = MiningReport()
    kept = [(0, close), (1, -5.0)]
    chosen = _filter(kept, positive, ["close", "far"], settings, random.Random(0), report)
    assert chosen == ["far"] and report.dropped["margin"] == 1


def test_corpus_bytes_that_are_not_utf8_are_named_by_file_and_line(setup, tmp_path):
    _, pairs, _, model, _ = setup
    rows = tmp_path / "pairs.jsonl"
    rows.write_text("".join(json.dumps({"anchor": a, "positive": p}) + "\n" for a, p in pairs))
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(b"w40 w41\nw42 \xff w43\n")
    out = tmp_path / "mined.jsonl"
    argv = ["mine", "--pairs", str(rows), "--corpus", str(corpus), "--model", str(model)]
    done = cli(*argv, "--out", str(out), "--no-progress")
    assert done.returncode == 2, done.stderr
    assert f"--corpus {corpus}, line 2: not UTF-8 text (byte 0xff)" in done.stderr
    assert not out.exists() and not (tmp_path / "mined.jsonl.index").exists()


def test_a_byte_order_mark_is_not_part_of_the_first_corpus_text(tmp_path):
    from clearformer.commands.mine import _corpus

    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(b"\xef\xbb\xbfw40 w41\n\nw42 w43\n")
    assert _corpus(corpus) == ["w40 w41", "w42 w43"]


def test_an_out_that_is_a_folder_is_refused_before_the_index_is_built(setup, tmp_path):
    _, _, _, model, beir = setup
    out = tmp_path / "mined"
    out.mkdir()
    argv = ["mine", "--data", str(beir), "--split", "dev", "--model", str(model)]
    done = cli(*argv, "--out", str(out), "--no-progress")
    assert done.returncode == 2, done.stderr
    assert f"--out {out}: is a folder" in done.stderr
    assert not (tmp_path / "mined.index").exists()
