"""Checkpoints: complete or absent, damaged ones fall back, pruning keeps the newest and the
best, a resume of another model shape is refused, a harmless change warns."""

from __future__ import annotations

import logging

import pytest
import torch

from clearformer.train import checkpoint as ckpt
from clearformer.train import train

from .train_helpers import final_weights, same_weights, tiny


def test_a_checkpoint_holds_everything_to_resume(tmp_path):
    train(tiny(steps=10), tmp_path / "run")
    loaded = ckpt.load_checkpoint(tmp_path / "run" / "checkpoints" / "step-00000010")
    state = loaded.state
    for key in ("optimizer", "sampler", "rng", "early_stopping", "loss_window", "metrics_lines"):
        assert key in state, key
    assert {"epoch", "position", "epoch_start_generator"} <= set(state["sampler"])
    assert len(state["rng"]) == 1  # one per rank
    assert {"python", "numpy", "torch"} <= set(state["rng"][0])
    assert loaded.meta["config"]["steps"] == 10 and loaded.meta["clearformer"]
    assert (tmp_path / "run" / "checkpoints" / "latest").read_text().strip() == "step-00000010"
    names = sorted(p.name for p in loaded.path.iterdir())
    assert names == ["COMPLETE", "meta.json", "model.safetensors", "state.pt"]


def test_keep_last_never_removes_the_newest_or_the_best(tmp_path):
    # min_delta=1: the first evaluation (step 10) stays the best for the whole run.
    train(tiny(keep_last=1, min_delta=1.0), tmp_path / "run")
    folder = tmp_path / "run" / "checkpoints"
    assert [p.name for p in ckpt.complete_checkpoints(folder)] == ["step-00000040", "step-00000010"]
    assert ckpt.read_pointer(folder, "best") == "step-00000010"
    assert ckpt.read_pointer(folder, "latest") == "step-00000040"


def damage(path, file="model.safetensors"):
    data = bytearray((path / file).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (path / file).write_bytes(bytes(data))


def test_a_damaged_newest_checkpoint_falls_back_to_the_previous(tmp_path, caplog):
    train(tiny(), tmp_path / "whole")
    with pytest.raises(KeyboardInterrupt):
        train(tiny(), tmp_path / "cut", progress=interrupt_at(25))
    damage(tmp_path / "cut" / "checkpoints" / "step-00000020")
    with caplog.at_level(logging.WARNING):
        result = train(tiny(), tmp_path / "cut")
    assert result.resumed_from == 10
    assert "model.safetensors: damaged" in caplog.text
    assert "previous complete checkpoint, step-00000010" in caplog.text
    assert same_weights(final_weights(tmp_path / "whole"), final_weights(tmp_path / "cut"))


def interrupt_at(step):
    def progress(event, record):
        if event == "train" and record["step"] >= step:
            raise KeyboardInterrupt

    return progress


@pytest.mark.parametrize("file", ["model.safetensors", "state.pt", "meta.json", "COMPLETE"])
def test_every_file_is_checked(tmp_path, file):
    train(tiny(steps=10), tmp_path / "run")
    path = tmp_path / "run" / "checkpoints" / "step-00000010"
    damage(path, file)
    with pytest.raises(ckpt.CheckpointError, match=file if file != "COMPLETE" else "marker"):
        ckpt.load_checkpoint(path)


def test_no_loadable_checkpoint_is_a_clear_error(tmp_path):
    from .train_helpers import run_train, tiny_flags

    train(tiny(steps=10), tmp_path / "run")
    damage(tmp_path / "run" / "checkpoints" / "step-00000010", "state.pt")
    result = run_train(*tiny_flags(steps=10), "--out", str(tmp_path / "run"))
    assert result.returncode == 2
    assert "no checkpoint in" in result.stderr and "state.pt: damaged" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_resume_that_changes_the_model_shape_is_refused(tmp_path):
    train(tiny(steps=10), tmp_path / "run")
    with pytest.raises(ckpt.CheckpointError, match=r"d_model: 16 in the checkpoint, 32 now"):
        train(tiny(steps=20, d_model=32), tmp_path / "run")
    with pytest.raises(ckpt.CheckpointError, match=r"changes the data order \(batch_size"):
        train(tiny(steps=20, batch_size=16), tmp_path / "run")


def test_a_harmless_change_is_a_warning(tmp_path, caplog):
    train(tiny(steps=10), tmp_path / "run")
    with caplog.at_level(logging.WARNING):
        result = train(tiny(steps=20, eval_every=5), tmp_path / "run")
    assert result.resumed_from == 10 and result.step == 20
    assert "resuming with eval_every=5 (the checkpoint's run had 10)" in caplog.text
    assert "steps=20" in caplog.text  # a change that alters the schedule is named too
    assert "measured with the old value" not in caplog.text
    # A change of how the metric is measured says what it does to the comparison: a rerank
    # run's checkpoint (its config only: check_resume reads no weights) with rerank_top moved.
    from dataclasses import replace
    from types import SimpleNamespace

    from clearformer.train import TrainConfig
    from clearformer.train.resume import check_resume

    rerank = TrainConfig(task="rerank", train_file="rows.jsonl", eval_data="beir")
    then = SimpleNamespace(
        meta={"config": rerank.to_dict()}, path=tmp_path / "r" / "checkpoints" / "s", weights={}
    )
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        check_resume(then, replace(rerank, rerank_top=10))
    said = "resuming with rerank_top=10 (the checkpoint's run had 50): the best score so far"
    assert said in caplog.text


def test_rerunning_a_finished_run_changes_nothing(tmp_path):
    train(tiny(steps=10), tmp_path / "run")
    before = final_weights(tmp_path / "run")
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text()
    result = train(tiny(steps=10), tmp_path / "run")
    assert result.resumed_from == 10 and result.step == 10
    assert same_weights(before, final_weights(tmp_path / "run"))
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == metrics


def test_weights_load_into_a_plain_model(tmp_path):
    from clearformer.train.tasks import build_task

    train(tiny(steps=10), tmp_path / "run")
    model = build_task(tiny()).build_model()
    model.load_state_dict(final_weights(tmp_path / "run"), strict=True)
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            b'{"step": 1}\n\xff\xfe{"step": 2}\n',
            r"metrics.jsonl is not UTF-8 text \(byte offset 12\)",
        ),
        (b'{"step": 1}\n{"step": \n', r"metrics.jsonl line 2: not valid JSON \(Expecting value"),
        (b'{"step": 1}\n[1, 2]\n', r"metrics.jsonl line 2: expected a JSON object, got list"),
    ],
    ids=["not-utf8", "not-json", "not-an-object"],
)
def test_a_damaged_metrics_log_is_named_with_its_line(tmp_path, content, message):
    # Was: UnicodeDecodeError or JSONDecodeError naming neither the file nor the line.
    from clearformer.train.run_folder import MetricsLog

    path = tmp_path / "metrics.jsonl"
    content += b'{"step": 3}\n'
    path.write_bytes(content)
    with pytest.raises(ValueError, match=message):
        MetricsLog(path, keep=2)  # the third record would be cut: it is not, on an error
    assert path.read_bytes() == content
