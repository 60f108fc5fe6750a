"""Faults a review found in ``clearformer mine`` and in the retrieval training rows, each held
here: texts that differ only by white space, BEIR pairs whose query is its document, columns
and fields that look like negatives, an ``--index`` of other texts, outputs onto inputs, lone
surrogates, a ``--retriever`` that is no model, a batch its rows cannot fill, and errors that
named the wrong flag."""

from __future__ import annotations

import json

import pytest

from clearformer.retrieval.mining import MiningSettings, mine_hard_negatives
from clearformer.train.pairs import read_pairs

from .contrastive_helpers import write_retrieval_data, write_sentence_transformer
from .index_helpers import cli

pytest.importorskip("sentence_transformers")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("mine-faults")
    model = write_sentence_transformer(root / "st")
    pairs, beir = write_retrieval_data(root / "data", rows=12)
    return {"model": model, "pairs": pairs, "beir": beir}


def _write_rows(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _mine(data, *flags: str):
    return cli("mine", "--model", str(data["model"]), "--no-progress", *flags)


# -- 3: an anchor or positive with other spaces is never its own negative ----------------------


def test_texts_differing_by_white_space_are_never_negatives_of_themselves(data, tmp_path):
    from clearformer import TextEncoder

    encoder = TextEncoder.from_pretrained(data["model"])
    pairs = [("w1 w2 w3 ", "w4 w5 w6"), ("w10 w11", " w12 w13 w14 ")]
    # The corpus holds the anchor and the positive stripped, and one text twice over.
    corpus = ["w1 w2 w3", "w12 w13 w14", "w30 w31", " w30 w31", "w40 w41", "w50 w51"]
    rows, report = mine_hard_negatives(
        pairs, encoder, tmp_path / "idx", corpus=corpus, settings=MiningSettings(10, 0, 10)
    )
    for row in rows:
        negatives = [n.strip() for n in row["negative"]]
        assert row["anchor"].strip() not in negatives and row["positive"].strip() not in negatives
        assert len(negatives) == len(set(negatives)), negatives
    assert report.dropped["anchor"] == 1  # "w1 w2 w3" left out as the first anchor itself
    path = tmp_path / "mined.jsonl"
    _write_rows(path, rows)
    assert len(read_pairs(path)) == 2  # train takes every row


# -- 4: a BEIR pair whose query is its document is left out and counted ------------------------


def test_a_beir_query_equal_to_its_document_is_left_out_and_counted(data, tmp_path):
    import shutil

    beir = tmp_path / "beir"
    shutil.copytree(data["beir"], beir)
    document = json.loads((beir / "corpus.jsonl").read_text().splitlines()[0])
    with (beir / "queries.jsonl").open("a") as f:
        f.write(json.dumps({"_id": "same", "text": document["text"] + " "}) + "\n")
    with (beir / "qrels" / "dev.tsv").open("a") as f:
        f.write(f"same\t{document['_id']}\t1\n")
    out = tmp_path / "mined.jsonl"
    done = _mine(data, "--data", str(beir), "--split", "dev", "--out", str(out), "-n", "2")
    assert done.returncode == 0, done.stderr
    assert "pairs left out, the query's text being its document's: 1" in done.stderr
    rows = read_pairs(out)  # train reads every row
    assert len(rows) == 12


# -- 5: columns and fields that look like negatives --------------------------------------------


@pytest.mark.parametrize("column", ["negative_id", "negative_score", "negatives", "Negative"])
def test_a_column_that_only_looks_like_a_negative_is_refused(tmp_path, column):
    path = tmp_path / "rows.csv"
    path.write_text(f"anchor,positive,negative,{column}\nw1,w2,w3,doc-77\n")
    with pytest.raises(ValueError, match=f"^{path}, line 1: column '{column}' is not read"):
        read_pairs(path)


def test_negative_columns_and_other_columns_are_read_as_documented(tmp_path):
    path = tmp_path / "rows.tsv"
    path.write_text("id\tanchor\tpositive\tnegative_1\tnegative_2\tscore\n7\tw1\tw2\tw3\tw4\t1\n")
    (pair,) = read_pairs(path)
    assert (pair.anchor, pair.positive, pair.negatives) == ("w1", "w2", ("w3", "w4"))


@pytest.mark.parametrize("key", ["negatives", "hard_negative", "neg"])
def test_a_jsonl_field_that_only_looks_like_a_negative_is_refused(tmp_path, key):
    path = tmp_path / "rows.jsonl"
    _write_rows(path, [{"anchor": "w1", "positive": "w2"}, {"anchor": "w1", "positive": "w2"}])
    with path.open("a") as f:
        f.write(json.dumps({"anchor": "w1", "positive": "w2", key: ["w3"]}) + "\n")
    with pytest.raises(ValueError, match=f"^{path}, line 3: field '{key}' is not read"):
        read_pairs(path)


def test_other_jsonl_fields_are_not_read(tmp_path):
    path = tmp_path / "rows.jsonl"
    _write_rows(path, [{"anchor": "w1", "positive": "w2", "negative": "w3", "id": 4}])
    assert read_pairs(path)[0].negatives == ("w3",)


# -- 6: --index holding an index of other texts ------------------------------------------------


def test_an_index_of_other_texts_is_refused_and_kept(data, tmp_path):
    from clearformer.index import VectorIndex

    index = tmp_path / "idx"
    rows = [json.loads(x) for x in data["pairs"].read_text().splitlines()]
    few, other = tmp_path / "few.jsonl", tmp_path / "other.jsonl"
    _write_rows(few, rows[:6])
    _write_rows(other, rows[6:])
    first = _mine(data, "--pairs", str(few), "--index", str(index), "--out", str(tmp_path / "a"))
    assert first.returncode == 0, first.stderr
    generation = VectorIndex.open(index).generation
    out = tmp_path / "b.jsonl"
    done = _mine(data, "--pairs", str(other), "--index", str(index), "--out", str(out))
    assert done.returncode == 2, done.stderr
    assert f"--index {index}: holds an index of 6 other texts" in done.stderr
    assert VectorIndex.open(index).generation == generation and not out.exists()
    # The same texts reuse it; OUT.index, mine's own, is built again at will.
    again = _mine(data, "--pairs", str(few), "--index", str(index), "--out", str(out))
    assert again.returncode == 0, again.stderr
    assert VectorIndex.open(index).generation == generation
    for pairs in (few, other):
        done = _mine(data, "--pairs", str(pairs), "--out", str(out))
        assert done.returncode == 0, done.stderr


# -- 7: --out onto an input --------------------------------------------------------------------


@pytest.mark.parametrize("onto", ["--pairs", "--corpus", "--index", "qrels", "corpus"])
def test_an_out_that_names_an_input_is_refused_before_any_work(data, tmp_path, onto):
    import shutil

    pairs, corpus = tmp_path / "pairs.jsonl", tmp_path / "corpus.txt"
    shutil.copy(data["pairs"], pairs)
    corpus.write_text("w40 w41\n")
    beir = tmp_path / "beir"
    shutil.copytree(data["beir"], beir)
    source = ["--pairs", str(pairs), "--corpus", str(corpus)]
    target = {"--pairs": pairs, "--corpus": corpus, "--index": tmp_path / "idx"}
    if onto in ("qrels", "corpus"):
        source = ["--data", str(beir), "--split", "dev"]
        target = {"qrels": beir / "qrels" / "dev.tsv", "corpus": beir / "corpus.jsonl"}
    out = target[onto]
    before = out.read_bytes() if out.exists() else None
    done = _mine(data, *source, "--index", str(tmp_path / "idx"), "--out", str(out))
    assert done.returncode == 2, done.stderr
    assert f"--out {out} is the " in done.stderr and "Traceback" not in done.stderr
    assert (out.read_bytes() if out.exists() else None) == before
    assert not (tmp_path / "idx").exists()


# -- 9: a lone surrogate -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("row", "field"),
    [
        ('{"anchor": "w1\\ud800", "positive": "w2"}', "field 'anchor'"),
        (
            '{"anchor": "w1", "positive": "w2", "negative": ["w3", "\\ude00"]}',
            "field 'negative' item 1",
        ),
    ],
)
def test_a_lone_surrogate_is_named_by_file_line_and_field(tmp_path, row, field):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"anchor": "w1", "positive": "w2"}\n' + row + "\n")
    with pytest.raises(ValueError, match=f"^{path}, line 2: {field} is not valid Unicode"):
        read_pairs(path)


def test_mine_and_train_refuse_a_lone_surrogate_before_any_model_loads(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"anchor": "w1", "positive": "w2"}\n{"anchor": "a\\ud800", "positive": "p"}\n')
    # No such model: the data's fault is found first.
    missing = str(tmp_path / "no-model")
    out = tmp_path / "mined.jsonl"
    done = cli("mine", "--pairs", str(path), "--model", missing, "--out", str(out))
    assert done.returncode == 2 and f"{path}, line 2: field 'anchor'" in done.stderr, done.stderr
    assert not (tmp_path / "mined.jsonl.index").exists()
    argv = ["--task", "contrastive", "--train-file", str(path), "--model", missing]
    done = cli("train", *argv, "--batch-size", "2", "-q", "--out", str(tmp_path / "run"))
    assert done.returncode == 2 and f"{path}, line 2: field 'anchor'" in done.stderr, done.stderr
    assert not (tmp_path / "run").exists()


# -- 11: --retriever and a batch the rows cannot fill, before the run folder -------------------


@pytest.mark.parametrize("retriever", ["missing", "beir"])
def test_a_retriever_that_is_no_model_is_refused_before_any_work(data, tmp_path, retriever):
    from clearformer.train import TrainConfig, train

    value = str(data["beir"]) if retriever == "beir" else str(tmp_path / "missing")
    argv = ["--task", "rerank", "--train-file", str(data["pairs"]), "--model", str(data["model"])]
    argv += ["--eval-data", str(data["beir"]), "--eval-split", "dev", "--retriever", value]
    run = tmp_path / "run"
    done = cli("train", *argv, "--steps", "1", "--batch-size", "2", "-q", "--out", str(run))
    assert done.returncode == 2, done.stderr
    assert f"--retriever: retriever must be a model directory, got {value!r}" in done.stderr
    assert not run.exists()
    config = TrainConfig(
        task="rerank",
        train_file=str(data["pairs"]),
        model=str(data["model"]),
        eval_data=str(data["beir"]),
        eval_split="dev",
        retriever=value,
        batch_size=2,
    )
    with pytest.raises(ValueError, match="retriever must be a model directory"):
        train(config, run)
    assert not run.exists()


def test_a_batch_the_rows_cannot_fill_names_the_file_and_makes_no_run_folder(data, tmp_path):
    path = tmp_path / "same-positive.jsonl"
    _write_rows(path, [{"anchor": f"w{i}", "positive": "w50 w51"} for i in range(8)])
    run = tmp_path / "run"
    argv = ["--task", "contrastive", "--train-file", str(path), "--model", str(data["model"])]
    done = cli("train", *argv, "--steps", "1", "--batch-size", "2", "-q", "--out", str(run))
    assert done.returncode == 2, done.stderr
    assert f"train_file {path}: batch_size 2 cannot be filled with distinct texts" in done.stderr
    assert not run.exists()


# -- 12: errors that named the wrong flag, or none ---------------------------------------------


def test_mine_names_its_own_flags(data, tmp_path):
    out = tmp_path / "mined.jsonl"
    missing = tmp_path / "nofile.jsonl"
    done = _mine(data, "--pairs", str(missing), "--out", str(out))
    assert done.returncode == 2 and f"--pairs {missing}: no such file" in done.stderr
    header = tmp_path / "header.csv"
    header.write_text("anchor,positive\n")
    done = _mine(data, "--pairs", str(header), "--out", str(out))
    assert done.returncode == 2 and f"--pairs {header}: no rows" in done.stderr
    for model in (tmp_path / "none", data["beir"]):  # missing, and a folder of other files
        done = _mine(
            data, "--pairs", str(missing), "--out", str(out), "--cross-encoder", str(model)
        )
        assert done.returncode == 2 and f"--cross-encoder {model}: " in done.stderr, done.stderr
    afile = tmp_path / "afile"
    afile.write_text("")
    done = _mine(data, "--pairs", str(data["pairs"]), "--out", str(out), "--index", str(afile))
    assert done.returncode == 2 and f"--index {afile}: is a file" in done.stderr, done.stderr
    assert not out.exists()
