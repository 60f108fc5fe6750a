"""``clearformer train --task rerank``: a cross-encoder trained on (query, positive, negatives)
rows, from an embedding model (a new head) or from a cross-encoder, exported as a directory
that sentence-transformers' CrossEncoder and clearformer's load to the same scores."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from .contrastive_helpers import write_retrieval_data, write_sentence_transformer
from .train_helpers import run_train

pytest.importorskip("sentence_transformers")

PAIRS = [("w1 w2", "w1 w3 w4"), ("w5 w6", "w40 w41 w42"), ("w7", "w7 w8 w9 w10 w11")]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("rerank")
    model = write_sentence_transformer(root / "st")
    pairs, beir = write_retrieval_data(root / "data")
    return {"model": model, "pairs": pairs, "beir": beir}


def _flags(data, model, **changes):
    values = {
        "task": "rerank",
        "train-file": data["pairs"],
        "model": model,
        "steps": 6,
        "batch-size": 8,
        "warmup-steps": 1,
        "lr": 1e-3,
        "eval-every": 3,
        "checkpoint-every": 3,
        **changes,
    }
    return [x for k, v in values.items() for x in (f"--{k}", str(v))]


def _same_scores(directory):
    from sentence_transformers import CrossEncoder as Reference

    from clearformer import CrossEncoder

    theirs = Reference(str(directory), device="cpu").predict(PAIRS)
    ours = CrossEncoder.from_pretrained(directory).predict(PAIRS)
    assert np.abs(np.asarray(theirs) - ours).max() <= 1e-6
    return ours


def test_an_embedding_model_becomes_a_reranker_both_libraries_load(data, tmp_path):
    run = tmp_path / "run"
    argv = _flags(
        data,
        data["model"],
        **{"eval-data": data["beir"], "retriever": data["model"], "rerank-top": 10},
    )
    result = run_train(*argv, "--out", str(run), "-q")
    assert result.returncode == 0, result.stderr
    config = json.loads((run / "model" / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"]
    assert config["num_labels"] == 1
    assert not (run / "model" / "modules.json").exists()  # not mistaken for an embedding model
    _same_scores(run / "model")
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "eval_ndcg@10" in r] == [0, 3, 6]
    described = json.loads((run / "data.json").read_text())
    # 24 rows of one positive and one negative each: positives weigh as much as negatives.
    assert described["positives"] == 24 and described["pos_weight"] == 1.0


def test_a_run_killed_before_its_first_evaluation_resumes_bitwise(tmp_path):
    """With --eval-data the first stage is built at the first evaluation: step 0's in a whole
    run, step 3's in a run resumed from step 2. Dropout's draws after it must not differ."""
    from clearformer.train import checkpoint as ckpt

    from .train_helpers import final_weights, same_weights

    model = write_sentence_transformer(tmp_path / "st", dropout=0.1)
    pairs, beir = write_retrieval_data(tmp_path / "data")
    data = {"pairs": pairs}
    changes = {"eval-data": beir, "retriever": model, "rerank-top": 10, "checkpoint-every": 2}
    argv = _flags(data, model, **changes)
    whole = tmp_path / "whole"
    assert run_train(*argv, "--out", str(whole), "-q").returncode == 0
    run = tmp_path / "run"
    died = run_train(*argv, "--out", str(run), "-q", **{ckpt.FAULT_ENV: "marker@3"})
    # Step 3's evaluation is the first best: its checkpoint is the one cut short, and the rerun
    # resumes from step 2's.
    assert died.returncode == 17, died.stderr
    result = run_train(*argv, "--out", str(run), "-q")
    assert result.returncode == 0, result.stderr
    assert same_weights(final_weights(run), final_weights(whole))
    assert (run / "metrics.jsonl").read_text() == (whole / "metrics.jsonl").read_text()


def test_a_cross_encoder_goes_on_training_and_its_weights_move(data, tmp_path):
    from sentence_transformers import CrossEncoder as Reference

    from .test_sequence_classification import make_classifier

    plain = tmp_path / "plain"
    make_classifier("bert", plain, num_labels=1)
    # A cross-encoder that scores with raw logits (as ms-marco's do), saved by
    # sentence-transformers: the trained one keeps that activation.
    base = tmp_path / "base"
    Reference(str(plain), device="cpu", activation_fn=torch.nn.Identity()).save(str(base))
    # The tiny classifier's vocabulary has 60 pieces: rows of word ids below it.
    rows = [
        {
            "anchor": f"w{i} w{i + 1}",
            "positive": f"w{i} w{i + 2} w{i + 3}",
            "negative": [f"w{(i + 20) % 50} w{(i + 30) % 50}"],
        }
        for i in range(16)
    ]
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = tmp_path / "run"
    result = run_train(
        *_flags({"pairs": pairs}, base, **{"eval-fraction": 0.25}), "--out", str(run), "-q"
    )
    assert result.returncode == 0, result.stderr
    before = _same_scores(base)
    after = _same_scores(run / "model")
    assert np.abs(before - after).max() > 1e-4
    from clearformer import CrossEncoder

    assert CrossEncoder.from_pretrained(run / "model").activation == "identity"
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert all("eval_loss" in r and "eval_accuracy" in r for r in records if "best" in r)


def test_loss_is_binary_cross_entropy_with_positives_weighed_by_the_negatives(data, tmp_path):
    from clearformer.train.tasks.rerank import PairBatch

    logits = torch.tensor([2.0, -1.0, 0.5, -3.0])
    labels = torch.tensor([1.0, 0.0, 0.0, 0.0])
    batch = PairBatch(torch.zeros(4, 1), torch.zeros(4, 1), torch.ones(4, 1), labels)
    task = type("T", (), {"pos_weight": 3.0})()
    from clearformer.train.tasks.rerank import RerankTask

    ours = RerankTask.loss_sum(task, logits, batch)
    # By hand: -(w * y * log s(x) + (1 - y) * log(1 - s(x))), summed.
    s = torch.sigmoid(logits)
    expected = -(3.0 * labels * torch.log(s) + (1 - labels) * torch.log(1 - s)).sum()
    assert torch.allclose(ours, expected, atol=1e-6)


def test_a_model_whose_family_has_no_classifier_is_refused_in_one_line(data, tmp_path):
    bad = tmp_path / "pairs.jsonl"
    bad.write_text('{"anchor": "w1", "positive": "w1"}\n')
    result = run_train(
        *_flags(data, data["model"], **{"train-file": bad}), "--out", str(tmp_path / "run")
    )
    assert result.returncode == 2 and "anchor equals its positive" in result.stderr
    assert not (tmp_path / "run").exists()


def _listwise_rows(tmp_path, negatives_per_row=(3, 1, 2, 3)):
    # The tiny classifier's vocabulary has 60 pieces: rows of word ids below it.
    rows = [
        {
            "anchor": f"w{i} w{i + 1}",
            "positive": f"w{i} w{i + 2} w{i + 3}",
            "negative": [f"w{(i + 7 * j + 20) % 50} w{(i + 3 * j + 30) % 50}" for j in range(n)],
        }
        for i, n in enumerate(negatives_per_row)
    ]
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows, pairs


def test_listwise_loss_equals_sentence_transformers_multiple_negatives_ranking_loss(tmp_path):
    """The listwise loss on clearformer's pair scores equals sentence-transformers' cross-encoder
    MultipleNegativesRankingLoss computed by sentence-transformers on the same weights and rows
    (each row alone: one row has no in-batch negatives, so only its own negatives count)."""
    from sentence_transformers.cross_encoder import CrossEncoder as Reference
    from sentence_transformers.cross_encoder.losses import MultipleNegativesRankingLoss

    from clearformer.train.config import TrainConfig
    from clearformer.train.tasks.rerank import RerankTask

    from .test_sequence_classification import make_classifier

    base = tmp_path / "base"
    make_classifier("bert", base, num_labels=1)
    rows, pairs = _listwise_rows(tmp_path)
    config = TrainConfig(task="rerank", train_file=str(pairs), model=str(base),
                         rerank_loss="listwise")  # fmt: skip
    task = RerankTask(config)
    examples = {anchor: (anchor, docs, labels) for anchor, docs, labels in
                task.train_examples + task.eval_examples}  # fmt: skip
    examples = [examples[row["anchor"]] for row in rows]  # the held-out split too, in row order
    scorer = task.build_model().eval()
    ours = []
    with torch.no_grad():
        for example in examples:
            batch = task._collate([example])
            ours.append(task.loss_sum(scorer(batch), batch).item())
    reference = Reference(str(base), device="cpu")
    reference.model.eval()
    loss = MultipleNegativesRankingLoss(reference, num_negatives=None)
    theirs = []
    with torch.no_grad():
        for row in rows:
            columns = [[row["anchor"]], [row["positive"]]] + [[n] for n in row["negative"]]
            theirs.append(loss(columns, labels=None).item())
    assert np.allclose(ours, theirs, atol=1e-5, rtol=0)
    # A batch of rows of different lengths sums each row's loss (-inf pads the short groups).
    with torch.no_grad():
        batch = task._collate(examples)
        assert batch.groups.shape == (4, 4) and int((batch.groups < 0).sum()) == 2 + 1
        together = task.loss_sum(scorer(batch), batch).item()
    assert together == pytest.approx(sum(theirs), abs=1e-4)


def test_listwise_loss_is_softmax_cross_entropy_toward_the_positive_by_hand():
    from clearformer.train.tasks.rerank import LISTWISE_SCALE, listwise_loss_sum

    logits = torch.tensor([2.0, -1.0, 0.5, -3.0, 1.0], requires_grad=True)
    groups = torch.tensor([[0, 1, 2], [3, 4, -1]])
    s = torch.sigmoid(logits.detach()) * LISTWISE_SCALE
    first = -(s[0] - torch.logsumexp(s[:3], 0))
    second = -(s[3] - torch.logsumexp(s[3:], 0))
    loss = listwise_loss_sum(logits, groups)
    assert loss.item() == pytest.approx((first + second).item(), abs=1e-6)
    loss.backward()
    assert torch.isfinite(logits.grad).all()  # the -inf pad gives no NaN gradient
    # Negative control: the positive scored highest gives the lowest loss of any permutation.
    best = listwise_loss_sum(torch.tensor([3.0, -3.0, -3.0]), torch.tensor([[0, 1, 2]]))
    worst = listwise_loss_sum(torch.tensor([-3.0, 3.0, -3.0]), torch.tensor([[0, 1, 2]]))
    assert best < worst


def test_a_listwise_reranker_trains_and_both_libraries_load_it(data, tmp_path):
    from .test_sequence_classification import make_classifier

    base = tmp_path / "base"
    make_classifier("bert", base, num_labels=1)
    rows, pairs = _listwise_rows(tmp_path, negatives_per_row=(2, 0, 3, 1) * 4)
    run = tmp_path / "run"
    flags = _flags({"pairs": pairs}, base, **{"eval-fraction": 0.25, "rerank-loss": "listwise"})
    result = run_train(*flags, "--out", str(run), "-q")
    assert result.returncode == 0, result.stderr
    before, after = _same_scores(base), _same_scores(run / "model")
    assert np.abs(before - after).max() > 1e-4
    described = json.loads((run / "data.json").read_text())
    # Rows without a negative are left out: one positive per example, the rest negatives.
    assert described["loss"] == "listwise"
    assert 0 < described["train_examples"] <= 12
    assert described["positives"] == described["train_examples"]
    assert described["train_pairs"] > described["train_examples"]
    records = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    evaluated = [r for r in records if "eval_accuracy" in r]
    assert evaluated and all(0.0 <= r["eval_accuracy"] <= 1.0 for r in evaluated)


def test_the_first_stage_reaches_a_rerank_top_above_its_default_depth(data, monkeypatch):
    """--rerank-top 150 reranks 150 texts: the first stage retrieves at least that many."""
    from clearformer import retrieval
    from clearformer.train import TrainConfig
    from clearformer.train.tasks import build_task

    asked = []

    class Result:
        run: dict = {}
        metrics = {"ndcg@10": 0.0}

    def evaluate(data_, encoder, settings, **kwargs):
        asked.append(settings.depth)
        return Result()

    monkeypatch.setattr(retrieval, "evaluate", evaluate)
    for top, depth in ((150, 150), (50, 100)):
        config = TrainConfig(
            task="rerank", train_file=str(data["pairs"]), model=str(data["model"]),
            eval_data=str(data["beir"]), rerank_top=top, retriever=str(data["model"]),
        )  # fmt: skip
        build_task(config)._first_stage_run()
        assert asked[-1] == depth
