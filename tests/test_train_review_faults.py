"""Faults a review found in training, each held here: a metric the evaluations do not report,
early stopping on resume, the contrastive evaluation and export against the training's prompts
and length, options the task does not read, and held-out sets that cannot be scored."""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest
import torch

from clearformer.train import TrainConfig, train
from clearformer.train.checkpoint import CheckpointError
from clearformer.train.early_stopping import EarlyStopping

from .contrastive_helpers import write_retrieval_data, write_sentence_transformer
from .train_helpers import run_train, tiny


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    pytest.importorskip("sentence_transformers")
    root = tmp_path_factory.mktemp("review")
    model = write_sentence_transformer(root / "st")
    pairs, beir = write_retrieval_data(root / "data")
    return {"model": model, "pairs": pairs, "beir": beir, "root": root}


def _retrieval_config(data, task, **changes) -> TrainConfig:
    base = {
        "task": task,
        "train_file": str(data["pairs"]),
        "model": str(data["model"]),
        "steps": 2,
        "batch_size": 4,
        "warmup_steps": 1,
        "eval_every": 1,
    }
    return TrainConfig(**{**base, **changes})


# -- B3: a metric the task does not report ------------------------------------------------------


@pytest.mark.parametrize("task", ["contrastive", "rerank"])
def test_metric_loss_with_eval_data_is_refused_before_any_work(data, tmp_path, task):
    # With eval_data the evaluations report retrieval measures only: "loss" would be missing
    # at the first evaluation, after the run folder was begun.
    config = _retrieval_config(data, task, eval_data=str(data["beir"]), metric="loss")
    with pytest.raises(ValueError, match=r"metric must be one of \('ndcg@10', 'mrr@10'"):
        train(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_cli_metric_loss_with_eval_data_is_one_line(data, tmp_path):
    argv = ["--task", "contrastive", "--train-file", str(data["pairs"]), "--model"]
    argv += [str(data["model"]), "--eval-data", str(data["beir"]), "--metric", "loss"]
    result = run_train(*argv, "--steps", "2", "--warmup-steps", "1", "--out", str(tmp_path / "r"))
    assert result.returncode == 2, result.stderr
    assert "got 'loss' (what task='contrastive' with eval_data reports)" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "r").exists()


# -- B4: early stopping on resume ----------------------------------------------------------------


def test_a_resume_applies_the_new_patience(tmp_path):
    # min_delta 1 on accuracy: no evaluation after the first improves. The first run (no
    # early stopping) ends with one bad evaluation (step 10); patience 2 stops at the next.
    run = tmp_path / "run"
    rule = {"eval_every": 5, "checkpoint_every": 5, "min_delta": 1.0}
    first = train(tiny(steps=10, **rule), run)
    assert (first.best_step, first.stopped_early) == (5, False)
    result = train(tiny(steps=30, patience=2, **rule), run)
    assert result.resumed_from == 10
    assert (result.step, result.stopped_early) == (15, True)


def test_restored_progress_goes_on_under_the_new_patience_and_min_delta():
    then = EarlyStopping("max", patience=2, min_delta=0.5)
    for step, value in [(1, 0.8), (2, 0.7), (3, 0.7)]:
        then.update(value, step)
    assert then.stopped
    now = EarlyStopping("max", patience=5, min_delta=0.0)
    now.load_state_dict(then.state_dict())
    assert (now.best, now.best_step, now.bad_evaluations) == (0.8, 1, 2)
    assert (now.patience, now.min_delta, now.stopped) == (5, 0.0, False)
    assert now.update(0.81, 4)  # within the old min_delta: an improvement under the new one


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"metric": "loss"}, "got metric='loss', mode='min'"),
        ({"mode": "min"}, "got metric='accuracy', mode='min'"),
    ],
)
def test_a_resume_that_changes_the_metric_or_mode_is_refused(tmp_path, changes, said):
    run = tmp_path / "run"
    train(tiny(steps=10), run)
    with pytest.raises(CheckpointError, match="chosen by metric='accuracy', mode='max'") as info:
        train(tiny(steps=20, **changes), run)
    assert said in str(info.value) and "\n" not in str(info.value)
    # The task's own metric named explicitly is the same metric: the run goes on.
    assert train(tiny(steps=20, metric="accuracy", mode="max"), run).step == 20


# -- B5, B6: the contrastive evaluation and export embed as the training did ---------------------

PROMPTS = {"query_prompt": "w59 ", "document_prompt": "w0 "}


def _reference_encoder(data, tmp_path, max_length):
    """The base model, its texts cut at ``max_length`` (written into a copy of its files)."""
    from clearformer import TextEncoder

    copy = tmp_path / "base-cut"
    shutil.copytree(data["model"], copy)
    path = copy / "tokenizer_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "model_max_length": max_length}))
    encoder = TextEncoder.from_pretrained(copy)
    assert encoder.max_length == max_length
    return encoder


def test_contrastive_evaluation_uses_the_prompts_and_max_length(data, tmp_path):
    from clearformer.retrieval import EvalSettings, evaluate, load_beir
    from clearformer.train.precision import Precision
    from clearformer.train.tasks.contrastive import ContrastiveTask

    config = _retrieval_config(
        data, "contrastive", eval_data=str(data["beir"]), max_length=8, **PROMPTS
    )
    task = ContrastiveTask(config)
    model = task.build_model().eval()
    cpu = torch.device("cpu")
    options = {"batch_size": 4, "precision": Precision("fp32", cpu), "device": cpu}
    scores = task.evaluate(model, metrics=task.metrics, **options)
    # The base model on texts with the prompts put before them, cut at 8 tokens.
    beir = load_beir(data["beir"], "dev")
    prompted = dataclasses.replace(
        beir,
        query_texts=["w59 " + t for t in beir.query_texts],
        corpus_texts=["w0 " + t for t in beir.corpus_texts],
    )
    reference = _reference_encoder(data, tmp_path, 8)
    want = evaluate(prompted, reference, EvalSettings(measures=task.metrics)).metrics
    assert scores == pytest.approx(dict(want), abs=1e-9)


def test_contrastive_export_records_the_prompts_and_max_length(data, tmp_path):
    from sentence_transformers import SentenceTransformer

    from clearformer import TextEncoder
    from clearformer.train.tasks.contrastive import ContrastiveTask

    task = ContrastiveTask(_retrieval_config(data, "contrastive", max_length=8, **PROMPTS))
    run = tmp_path / "run"
    run.mkdir()
    task.export(task.build_model().state_dict(), run)
    out = run / "model"
    st_config = json.loads((out / "config_sentence_transformers.json").read_text())
    assert st_config["prompts"]["query"] == "w59 " and st_config["prompts"]["document"] == "w0 "
    assert json.loads((out / "tokenizer_config.json").read_text())["model_max_length"] == 8
    ours = TextEncoder.from_pretrained(out)
    assert ours.max_length == 8
    theirs = SentenceTransformer(str(out), device="cpu")
    assert theirs.max_seq_length == 8
    rows = [json.loads(x) for x in data["pairs"].read_text().splitlines()]
    queries, documents = [r["anchor"] for r in rows], [r["positive"] for r in rows]
    # encode_query / encode_document add the training's prompts; cut as the training cut.
    reference = _reference_encoder(data, tmp_path, 8)
    want = reference.encode(["w59 " + q for q in queries], normalize=True)
    assert np.abs(theirs.encode_query(queries) - want).max() <= 1e-6
    assert np.abs(ours.encode(queries, prompt_name="query") - want).max() <= 1e-6
    want = reference.encode(["w0 " + d for d in documents], normalize=True)
    assert np.abs(theirs.encode_document(documents) - want).max() <= 1e-6


# -- B7: options the task does not read ----------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        (
            {"task": "rerank", "query_prompt": "query: "},
            "query_prompt is for task='contrastive'; task='rerank' does not read it, "
            "got query_prompt='query: '",
        ),
        ({"task": "rerank", "symmetric": True}, "symmetric is for task='contrastive'"),
        ({"task": "rerank", "mini_batch_size": 2}, "mini_batch_size is for task='contrastive'"),
        ({"task": "rerank", "matryoshka_dims": "8"}, "matryoshka_dims is for task='contrastive'"),
        (
            {"task": "rerank", "eval_file": "/nonexistent"},
            "eval_file is for task='classify', 'mlm' or 'translate'; task='rerank'",
        ),
        ({"task": "contrastive", "eval_file": "/nonexistent"}, "task='contrastive' does not"),
        ({"task": "contrastive", "from_scratch": True}, "from_scratch is for task='classify'"),
        ({"task": "classify", "eval_data": "foo"}, "eval_data is for task='contrastive' or"),
        ({"task": "classify", "rerank_loss": "listwise"}, "rerank_loss is for task='rerank'"),
        ({"task": "mlm", "dropout": 0.0}, "dropout is for task='digits', 'classify', 'reverse'"),
        (
            {"task": "rerank", "rerank_top": 10},
            "rerank_top applies to task='rerank' only with eval_data, got rerank_top=10",
        ),
        (
            {"task": "contrastive", "eval_data": "beir", "eval_fraction": 0.1},
            "eval_fraction applies to task='contrastive' only without eval_data",
        ),
    ],
)
def test_a_field_the_task_does_not_read_is_refused(changes, said):
    with pytest.raises(ValueError) as info:
        TrainConfig(train_file="rows.jsonl", **changes)
    assert said in str(info.value)


def test_cli_names_the_flag_and_print_config_round_trips(data, tmp_path):
    rerank = ["--task", "rerank", "--train-file", str(data["pairs"])]
    refused = run_train(*rerank, "--query-prompt", "query: ", "--print-config")
    assert refused.returncode == 2
    assert "--query-prompt: query_prompt is for task='contrastive'" in refused.stderr
    # Defaults pass, given or not: a printed config loads back to itself.
    printed = run_train(*rerank, "--query-prompt", "", "--print-config")
    assert printed.returncode == 0, printed.stderr
    path = tmp_path / "rerank.toml"
    path.write_text(printed.stdout)
    again = run_train("--config", str(path), "--print-config")
    assert again.returncode == 0 and again.stdout == printed.stdout


# -- B8 and classify: held-out sets that cannot be scored ----------------------------------------


def test_listwise_names_the_held_out_rows_when_they_have_no_negatives(data, tmp_path):
    from clearformer.train.pairs import read_pairs
    from clearformer.train.tasks.contrastive import _split
    from clearformer.train.tasks.rerank import RerankTask

    rows = [json.loads(x) for x in data["pairs"].read_text().splitlines()]
    _, held = _split(read_pairs(data["pairs"]), 0.25, 0)
    held_anchors = {p.anchor for p in held}
    for row in rows:  # the training rows keep their negatives, the held-out ones have none
        if row["anchor"] in held_anchors:
            del row["negative"]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = _retrieval_config(
        data, "rerank", train_file=str(path), rerank_loss="listwise", eval_fraction=0.25
    )
    with pytest.raises(ValueError) as info:
        RerankTask(config)
    said = str(info.value)
    assert "held out for evaluation (eval_fraction=0.25, split_seed=0)" in said
    assert f"none of these {len(held)} has one" in said


def test_classify_without_a_held_out_example_is_refused_at_load(tmp_path):
    from clearformer.train.tasks import build_task

    path = tmp_path / "one-each.csv"
    path.write_text("text,label\nw1 w2,a\nw3 w4,b\nw5,c\n")
    config = TrainConfig(task="classify", train_file=str(path), eval_fraction=0.5)
    with pytest.raises(ValueError, match="no example to hold out for evaluation: each of the 3"):
        build_task(config)
