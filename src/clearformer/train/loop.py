"""The training loop. Read it top to bottom: set up, resume, step, evaluate, checkpoint.

Everything it uses is a small module of its own: the config (``config.py``), the task's data
and model (``tasks/``), the batch order (``sampler.py``), the learning rate (``schedule.py``),
one step and one evaluation (``step.py``), early stopping, checkpoints, the run folder.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .. import __version__
from . import checkpoint as ckpt
from .config import TrainConfig, check_against_data
from .early_stopping import EarlyStopping
from .plots import write_loss_plot
from .precision import Precision, resolve_device
from .resume import check_resume, restore
from .rng import rng_state, seed_everything
from .run_folder import MetricsLog, RunFolder
from .sampler import BucketSampler
from .schedule import learning_rate
from .step import build_optimizer, evaluate, train_step
from .tasks import build_task

log = logging.getLogger(__name__)

Progress = Callable[[str, dict[str, Any]], None]  # (event, record): "train", "eval", ...


@dataclass
class TrainResult:
    step: int  # optimizer steps done
    resumed_from: int | None  # the checkpoint's step, when the run resumed
    best: float | None  # best value of the metric, and the step it was reached at
    best_step: int | None
    stopped_early: bool
    final: dict[str, float]  # the last evaluation
    run_dir: Path


def train(
    config: TrainConfig,
    out: str | Path,
    *,
    progress: Progress | None = None,
    invocation: dict[str, Any] | None = None,
) -> TrainResult:
    """Train ``config`` into the run folder ``out``; resume when it holds a checkpoint."""
    started = time.perf_counter()
    emit = progress or (lambda event, record: None)
    run = RunFolder(out)
    run.check_usable()
    device = resolve_device(config.device)
    precision = Precision(config.precision, device)  # refuses fp16 on CPU before any work
    task = build_task(config)
    check_against_data(config, len(task.train_lengths))
    metric = config.metric or task.metric
    if metric != "loss" and metric not in task.metrics:
        raise ValueError(f"metric must be one of {('loss', *task.metrics)}, got {metric!r}")
    run.create()
    ckpt.remove_partial(run.checkpoints)
    resume = ckpt.load_newest(run.checkpoints)
    if resume is not None:
        check_resume(resume, config)  # a model of another shape is refused here
    run.write_config(config)
    run.record_invocation({**(invocation or {}), "resumed_from": resume and resume.step})

    # The model, optimizer and the state the loop carries.
    seed_everything(config.seed)
    model = task.build_model().to(device)
    optimizer = build_optimizer(model, config)
    scaler = precision.grad_scaler()
    sampler = BucketSampler(task.train_lengths, config.batch_size, seed=config.seed)
    stopper = EarlyStopping(config.mode, config.patience, config.min_delta)
    step, window = 0, {"sum": 0.0, "count": 0}  # the training loss since the last record
    if resume is not None:
        step, window = restore(resume, model, optimizer, scaler, sampler, stopper)
        emit("resume", {"step": step, "checkpoint": resume.path.name})
    else:
        run.write_json("data.json", _data_report(task, sampler, config))
    metrics = MetricsLog(run.metrics, keep=resume.state["metrics_lines"] if resume else 0)
    last_eval: dict[str, float] = _last_eval(metrics.records)
    eval_batch = max(config.batch_size // config.accumulation, 1)

    model.train()
    while step < config.steps and not stopper.stopped:
        lr = learning_rate(
            step,
            lr=config.lr,
            warmup_steps=config.warmup_steps,
            total_steps=config.steps,
            decay=config.decay,
            min_lr_ratio=config.min_lr_ratio,
        )
        for group in optimizer.param_groups:
            group["lr"] = lr
        indices = sampler.next_batch()
        epoch = sampler.epoch  # after the call: the batch may be the first of a new epoch
        loss, grad_norm = train_step(
            model,
            task,
            indices,
            accumulation=config.accumulation,
            optimizer=optimizer,
            precision=precision,
            scaler=scaler,
            clip_norm=config.clip_norm,
            device=device,
        )
        step += 1
        window["sum"] += loss
        window["count"] += 1
        last = step == config.steps
        if step % config.log_every == 0 or last:
            record = {
                "step": step,
                "epoch": epoch,
                "loss": window["sum"] / window["count"],
                "lr": lr,
                "grad_norm": grad_norm,
            }
            metrics.write(record)
            emit("train", record)
            window = {"sum": 0.0, "count": 0}

        is_best = False
        if step % config.eval_every == 0 or last:
            scores = evaluate(
                model,
                task,
                batch_size=eval_batch,
                precision=precision,
                metrics=task.metrics,
                device=device,
            )
            last_eval = {f"eval_{k}": v for k, v in scores.items()}
            is_best = stopper.update(scores[metric], step)
            record = {"step": step, **last_eval, "best": is_best}
            metrics.write(record)
            emit("eval", record)

        if step % config.checkpoint_every == 0 or is_best or last or stopper.stopped:
            metrics.sync()  # the records the checkpoint counts are on disk before it is
            state = {
                "step": step,
                "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict() if scaler is not None else None,
                "sampler": sampler.state_dict(),
                "rng": ckpt.rng_to_tensors(rng_state()),
                "early_stopping": stopper.state_dict(),
                "loss_window": dict(window),
                "metrics_lines": len(metrics),
            }
            meta = {
                "step": step,
                "epoch": sampler.epoch,
                "config": config.to_dict(),
                "clearformer": __version__,
                "torch": torch.__version__,
            }
            path = ckpt.save_checkpoint(run.checkpoints, step, model.state_dict(), state, meta)
            if is_best:
                ckpt.write_pointer(run.checkpoints, ckpt.BEST, path.name)
            ckpt.prune(run.checkpoints, config.keep_last)
            emit("checkpoint", {"step": step, "path": str(path), "best": is_best})

    metrics.close()
    return _finish(
        run, model, metrics.records, config, step, stopper, last_eval, resume, started, emit
    )


def _finish(run, model, records, config, step, stopper, last_eval, resume, started, emit):
    """The final weights, the summary and the loss curve."""
    from safetensors.torch import save as save_safetensors

    from ..io import atomic_write

    with atomic_write(run.path / "model.safetensors", "wb") as handle:
        handle.write(
            save_safetensors(
                {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
            )
        )
    plot = write_loss_plot(records, run.path / "loss.png", title=f"clearformer train {config.task}")
    summary = {
        "task": config.task,
        "steps": step,
        "stopped_early": stopper.stopped,
        "metric": config.metric or "task default",
        "best": stopper.best,
        "best_step": stopper.best_step,
        "final": last_eval,
        "resumed_from": resume.step if resume else None,
        "seconds_this_invocation": round(time.perf_counter() - started, 2),
        "loss_plot": plot,
    }
    run.write_json("summary.json", summary)
    emit("done", summary)
    return TrainResult(
        step,
        resume.step if resume else None,
        stopper.best,
        stopper.best_step,
        stopper.stopped,
        last_eval,
        run.path,
    )


def _last_eval(records: list[dict]) -> dict[str, float]:
    for record in reversed(records):
        if any(k.startswith("eval_") for k in record):
            return {k: v for k, v in record.items() if k.startswith("eval_")}
    return {}


def _data_report(task, sampler: BucketSampler, config: TrainConfig) -> dict:
    """The data, and how much padding the bucketed batches save over plain shuffled ones."""
    from .sampler import padding_fraction, random_batches

    lengths = task.train_lengths
    return {
        **task.describe(),
        "padding_fraction": {
            "bucketed": padding_fraction(sampler.epoch_batches(), lengths),
            "shuffled": padding_fraction(
                random_batches(len(lengths), config.batch_size, config.seed), lengths
            ),
            "packed": 0.0,
        },
    }
