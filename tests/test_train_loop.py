"""The loop: bitwise reproducible, accumulation equals one big batch, resume equals an
uninterrupted run, early stopping, precisions, activation checkpointing."""

from __future__ import annotations

import json

import pytest
import torch

from clearformer.train import train
from clearformer.train.early_stopping import EarlyStopping
from clearformer.train.precision import Precision
from clearformer.train.step import build_optimizer, micro_batches, train_step
from clearformer.train.tasks import build_task

from .train_helpers import final_weights, same_weights, tiny


def records(run):
    return (run / "metrics.jsonl").read_text()


def test_two_runs_are_bitwise_equal(tmp_path):
    a = train(tiny(), tmp_path / "a")
    b = train(tiny(), tmp_path / "b")
    assert same_weights(final_weights(tmp_path / "a"), final_weights(tmp_path / "b"))
    assert records(tmp_path / "a") == records(tmp_path / "b")
    assert a.final == b.final and a.step == 40
    c = train(tiny(seed=1), tmp_path / "c")
    assert not same_weights(final_weights(tmp_path / "a"), final_weights(tmp_path / "c"))
    assert c.final != a.final


class Stop(Exception):
    pass


def stop_at(step):
    def progress(event, record):
        if event == "train" and record["step"] >= step:
            raise Stop

    return progress


@pytest.mark.parametrize("stop", [5, 23, 35])  # before any checkpoint, between, near the end
def test_resume_after_a_crash_equals_the_uninterrupted_run(tmp_path, stop):
    train(tiny(), tmp_path / "whole")
    with pytest.raises(Stop):
        train(tiny(), tmp_path / "cut", progress=stop_at(stop))
    result = train(tiny(), tmp_path / "cut")
    assert result.resumed_from == (stop // 10) * 10 or (stop < 10 and result.resumed_from is None)
    assert same_weights(final_weights(tmp_path / "whole"), final_weights(tmp_path / "cut"))
    assert records(tmp_path / "whole") == records(tmp_path / "cut")


def test_resume_mid_epoch_and_across_epochs_with_accumulation(tmp_path):
    # batch 200 of 1438 examples: 8 batches an epoch, so step 13 is mid-epoch 1.
    config = tiny(batch_size=200, accumulation=3, checkpoint_every=3, steps=20)
    train(config, tmp_path / "whole")
    with pytest.raises(Stop):
        train(config, tmp_path / "cut", progress=stop_at(15))
    train(config, tmp_path / "cut")
    assert same_weights(final_weights(tmp_path / "whole"), final_weights(tmp_path / "cut"))
    assert records(tmp_path / "whole") == records(tmp_path / "cut")


def grads_after_one_step(accumulation, indices):
    config = tiny(dropout=0.0)
    task = build_task(config)
    torch.manual_seed(0)
    model = task.build_model()
    optimizer = build_optimizer(model, config)
    loss, norm = train_step(
        model,
        task,
        indices,
        accumulation=accumulation,
        optimizer=optimizer,
        precision=Precision("fp32", torch.device("cpu")),
        scaler=None,
        clip_norm=0.0,
        device=torch.device("cpu"),
    )
    return loss, norm, {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("accumulation", [2, 4, 7])
def test_accumulation_of_n_micro_batches_equals_one_batch(accumulation):
    indices = list(range(0, 560, 20))  # 28 examples
    loss1, norm1, one = grads_after_one_step(1, indices)
    lossn, normn, many = grads_after_one_step(accumulation, indices)
    assert lossn == pytest.approx(loss1, rel=1e-6)
    assert normn == pytest.approx(norm1, rel=1e-5)
    for name in one:
        torch.testing.assert_close(many[name], one[name], rtol=1e-5, atol=1e-7, msg=name)


def test_micro_batches_cover_the_step_in_order():
    assert micro_batches(list(range(10)), 3) == [[0, 1, 2], [3, 4, 5, 6], [7, 8, 9]]
    assert micro_batches([4, 5], 5) == [[4], [5]]


def test_clipping_bounds_the_update():
    # With clip_norm tiny, the step's gradient is rescaled to that norm (reported: before).
    config = tiny(dropout=0.0)
    task = build_task(config)
    model = task.build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    cpu = torch.device("cpu")
    _, norm = train_step(
        model,
        task,
        list(range(32)),
        accumulation=1,
        optimizer=optimizer,
        precision=Precision("fp32", cpu),
        scaler=None,
        clip_norm=1e-3,
        device=cpu,
    )
    after = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))
    assert norm > 1e-2
    assert after.item() == pytest.approx(1e-3, rel=1e-3)


def test_early_stopping_stops_and_keeps_the_best(tmp_path):
    # min_delta=1: no later evaluation can beat the first by that much.
    result = train(tiny(patience=2, min_delta=1.0), tmp_path / "run")
    assert result.stopped_early and result.step == 30  # evaluations at 10 (best), 20, 30
    assert result.best_step == 10
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["stopped_early"] and summary["best_step"] == 10
    assert (tmp_path / "run" / "checkpoints" / "best").read_text().strip() == "step-00000010"
    assert (tmp_path / "run" / "checkpoints" / "step-00000010").is_dir()


@pytest.mark.parametrize(
    ("mode", "values", "best", "stopped_after"),
    [
        ("max", [0.5, 0.6, 0.6, 0.55], 0.6, 4),
        ("min", [3.0, 2.0, 2.5, 2.1], 2.0, 4),
        ("max", [0.5, 0.50001, 0.4], 0.5, 3),  # min_delta 0.001 ignores the tiny gain
    ],
)
def test_early_stopping_modes(mode, values, best, stopped_after):
    stopper = EarlyStopping(mode, patience=2, min_delta=1e-3)
    for n, value in enumerate(values, 1):
        stopper.update(value, n)
        if stopper.stopped:
            break
    assert stopper.best == best
    assert stopper.stopped and n == stopped_after


def test_bf16_trains_on_cpu(tmp_path):
    # The tiny model leaves chance (0.1) after about 100 steps.
    result = train(tiny(precision="bf16", steps=150, lr=3e-3, eval_every=150), tmp_path / "run")
    assert result.final["eval_accuracy"] > 0.3
    assert torch.isfinite(torch.tensor(result.final["eval_loss"]))


def test_fp16_is_refused_on_cpu():
    with pytest.raises(ValueError, match=r"precision='fp16' needs a CUDA GPU.*bf16"):
        Precision("fp16", torch.device("cpu"))


def test_activation_checkpointing_changes_memory_not_results(tmp_path):
    train(tiny(steps=10, dropout=0.0), tmp_path / "plain")
    train(tiny(steps=10, dropout=0.0, checkpointing=True), tmp_path / "recomputed")
    a, b = final_weights(tmp_path / "plain"), final_weights(tmp_path / "recomputed")
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-6)


@pytest.fixture
def counter_dropout(monkeypatch):
    """The run takes counter-based dropout masks (the suite keeps PyTorch's otherwise)."""
    from clearformer.fast import avx512
    from clearformer.machine import machine

    if not machine().avx512_available or avx512.load(build=True).choice != "loaded":
        pytest.skip("needs clearformer's AVX-512 library")
    for variable in ("CLEARFORMER_KERNELS", "CLEARFORMER_AVX512"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("CLEARFORMER_AVX512_DROPOUT", "on")


def test_counter_masks_runs_are_recorded_reproducible_and_resume_bitwise(tmp_path, counter_dropout):
    train(tiny(), tmp_path / "whole")
    train(tiny(), tmp_path / "again")
    with pytest.raises(Stop):
        train(tiny(), tmp_path / "cut", progress=stop_at(23))
    train(tiny(), tmp_path / "cut")
    whole = final_weights(tmp_path / "whole")
    for other in ("again", "cut"):
        assert same_weights(whole, final_weights(tmp_path / other))
        assert records(tmp_path / "whole") == records(tmp_path / other)
    said = [
        json.loads(x) for x in (tmp_path / "cut" / "invocations.jsonl").read_text().splitlines()
    ]
    assert all(entry["dropout_masks"].startswith("counter") for entry in said)
    # The masks are not PyTorch's: the same run with them trains other weights.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("CLEARFORMER_AVX512_DROPOUT", "off")
        train(tiny(), tmp_path / "torch")
    assert not same_weights(whole, final_weights(tmp_path / "torch"))
    said = json.loads((tmp_path / "torch" / "invocations.jsonl").read_text().splitlines()[0])
    assert said["dropout_masks"].startswith("torch")
