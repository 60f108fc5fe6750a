"""The training loop. Read it top to bottom: set up, resume, step, evaluate, checkpoint.

Everything it uses is a small module of its own: the config (``config.py``), the task's data
and model (``tasks/``), the batch order (``sampler.py``), the learning rate (``schedule.py``),
one step and one evaluation (``step.py``), early stopping, checkpoints, the run folder.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .. import routes
from ..dropout import counter_masks
from ..options import Decision
from ..version import __version__
from . import checkpoint as ckpt
from . import distributed
from .config import TrainConfig, check_against_data, check_model_files, resolve_mode
from .early_stopping import EarlyStopping
from .plots import write_loss_plot
from .precision import Precision, resolve_device
from .resume import check_early_stopping, check_resume, restore, train_file_digest
from .rng import rng_state, seed_everything, set_rng_state
from .run_folder import MetricsLog, RunFolder
from .sampler import BucketSampler, EpochSampler
from .schedule import learning_rate
from .step import build_optimizer, evaluate, train_step
from .tasks import build_task, reported_metrics

log = logging.getLogger(__name__)

# (event, record): "phase" ({"message"}: a step of the set-up begins), "start" (the first
# step, the last, log_every, parameters), "resume", "train", "eval", "checkpoint", "stopped".
Progress = Callable[[str, dict[str, Any]], None]


def _phase(progress: Progress | None, message: str, *, main: bool = True) -> None:
    """The set-up's slow steps (reading and tokenizing data, building the model) are said as
    they begin: a run's first loss line can be seconds away."""
    log.info("%s", message)
    if progress is not None and main:
        progress("phase", {"message": message})


@dataclass
class TrainResult:
    step: int  # optimizer steps done
    resumed_from: int | None  # the checkpoint's step, when the run resumed
    best: float | None  # best value of the metric, and the step it was reached at
    best_step: int | None
    stopped_early: bool
    final: dict[str, float]  # the last evaluation
    run_dir: Path
    model: torch.nn.Module  # the trained model (under FSDP: this rank's shards)
    interrupted: bool = False  # stopped on request before the last step, checkpointed
    metric: str = ""  # the metric that picked the best checkpoint (the config's or the task's)


def train(
    config: TrainConfig,
    out: str | Path,
    *,
    progress: Progress | None = None,
    invocation: dict[str, Any] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> TrainResult:
    """Train ``config`` into the run folder ``out``; resume when it holds a checkpoint.

    ``should_stop`` is asked after every step; when it says True (a signal handler's flag),
    the step's checkpoint is written and the run returns ``interrupted``, to be resumed.
    """
    started = time.perf_counter()
    run = RunFolder(out)
    run.check_usable()
    device = resolve_device(config.device)
    precision = Precision(config.precision, device)  # refuses fp16 on CPU before any work
    # Before the process group exists: under torchrun, rank 0 (as the launcher numbers it)
    # speaks for all.
    launched_main = os.environ.get("RANK", "0") == "0"
    metric = _check_metric(config)  # before the data is read
    check_model_files(config)
    _phase(progress, f"loading the {config.task} task's data", main=launched_main)
    task = build_task(config)
    check_against_data(config, len(task.train_lengths))
    # Before the run folder: a sampler may find the data cannot fill a batch.
    sampler = _make_sampler(task, config)
    context = distributed.setup(config.distributed, device)
    try:
        distributed.check_split(config.batch_size, config.accumulation, context.world)
        masks = _dropout_masks(device, context)
        invocation = {**(invocation or {}), "dropout_masks": f"{masks.choice}: {masks.reason}"}
        with counter_masks(masks.choice == "counter"):
            return _train(
                config,
                run,
                task,
                sampler,
                metric,
                device,
                precision,
                context,
                started,
                progress,
                invocation,
                should_stop or (lambda: False),
            )
    finally:
        context.close()


def _make_sampler(task, config: TrainConfig) -> EpochSampler:
    """The batch order. A task whose batches follow a rule of their own (contrastive: no text
    twice in a batch) makes its sampler; the others bucket by length. The sampler draws from
    a generator of its own, so where it is made changes no draw."""
    make_sampler = getattr(task, "make_sampler", None)
    if make_sampler is not None:
        return make_sampler(config.batch_size, config.seed)
    return BucketSampler(task.train_lengths, config.batch_size, seed=config.seed)


def _check_metric(config: TrainConfig) -> str:
    """The metric that picks the best checkpoint (the config's, else the task's), refused
    unless the task's evaluations report it in this configuration: ``metric="loss"`` with
    ``eval_data`` would otherwise fail at the first evaluation, with the run folder begun."""
    default, reported = reported_metrics(config)
    metric = config.metric or default
    if metric not in reported:
        where = " with eval_data" if config.eval_data else ""
        raise ValueError(
            f"metric must be one of {reported}, got {metric!r} (what task={config.task!r}"
            f"{where} reports)"
        )
    return metric


def _dropout_masks(device, context) -> Decision:
    """The generator of the run's dropout masks (:mod:`clearformer.dropout`), decided once.
    On a CPU rank 0 first builds and measures clearformer's kernels where no verdict is cached
    (seconds, once per machine, repaid by any run); the other ranks read the verdicts after
    the barrier, so every rank decides alike."""
    if device.type != "cpu":
        return Decision("torch", f"{device.type}: PyTorch's dropout")
    if context.is_main:
        from ..calibration.kernels import measure_before_serving

        measure_before_serving()
    context.barrier()
    masks = routes.dropout_masks_route()
    log.info("dropout masks: %s (%s)", masks.choice, masks.reason)
    return masks


def _train(
    config,
    run,
    task,
    sampler,
    metric,
    device,
    precision,
    context,
    started,
    progress,
    invocation,
    should_stop,
):
    main = context.is_main  # only rank 0 writes the run folder and reports progress
    emit = progress if (progress and main) else (lambda event, record: None)
    if main:
        run.create()
        ckpt.remove_partial(run.checkpoints)
    context.barrier()
    digest = train_file_digest(config)  # recorded in every checkpoint, checked on resume
    resume = ckpt.load_newest(run.checkpoints)
    if resume is not None:
        check_resume(resume, config, digest)  # a model of another shape is refused here
        # ... and another metric or mode than the one the best checkpoint was chosen by.
        check_early_stopping(resume, metric, resolve_mode(config.mode, metric), task.metric)
    # What a task keeps beside the weights (translate: its vocabularies), which decoding needs
    # exactly as trained: a resume that would build other ones is refused.
    task_files = task.run_files() if hasattr(task, "run_files") else {}
    if resume is not None:
        run.check_same_files(task_files)
    if main:
        run.write_files(task_files)
        run.write_config(config)
        run.record_invocation(
            {
                **(invocation or {}),
                "resumed_from": resume and resume.step,
                "world_size": context.world,
            }
        )

    # The model, optimizer and the state the loop carries. Every rank builds the same
    # model from the same seed; dropout then draws from a generator of each rank's own.
    seed_everything(config.seed)
    _phase(progress, "building the model", main=main)
    model = distributed.wrap(task.build_model().to(device), context, device)
    optimizer = build_optimizer(model, config)  # after FSDP: it shards the parameters
    scaler = precision.grad_scaler()
    stopper = EarlyStopping(resolve_mode(config.mode, metric), config.patience, config.min_delta)
    seed_everything(config.seed + 1_000_003 * context.rank)
    step, window = 0, {"sum": 0.0, "count": 0}  # the training loss since the last record
    if resume is not None:
        step, window = restore(
            resume, model, optimizer, scaler, sampler, stopper, context, config.seed
        )
        emit("resume", {"step": step, "checkpoint": resume.path.name})
        if main:
            _repair_best_pointer(run.checkpoints, stopper.best_step)
    elif main:
        run.write_json("data.json", _data_report(task, sampler, config))
    keep = resume.state["metrics_lines"] if resume else 0
    metrics = MetricsLog(run.metrics if main else None, keep=keep)
    last_eval: dict[str, float] = _last_eval(metrics.records)
    eval_batch = max(config.batch_size // config.accumulation, 1)
    # A task may own its step (contrastive: GradCache over the whole batch) and its
    # evaluation (retrieval metrics); the others take the classification ones.
    step_fn = getattr(task, "train_step", None)
    step_fn = (lambda m, t, i, **kw: t.train_step(m, i, **kw)) if step_fn else train_step
    task_evaluate = getattr(task, "evaluate", None)

    def evaluate_now() -> dict[str, float]:
        options = {"batch_size": eval_batch, "precision": precision, "metrics": task.metrics}
        if task_evaluate is not None:
            return task_evaluate(model, device=device, **options)
        return evaluate(model, task, device=device, **options)

    if resume is None and getattr(task, "evaluate_before_training", False):
        # The starting point, recorded as step 0: what training is measured against. It
        # takes no part in the best checkpoint (there is none of step 0). The random state is
        # put back after it, so that a run with it and a resumed run draw the same.
        before = rng_state()
        model.eval()
        scores = evaluate_now()
        model.train()
        set_rng_state(before)
        record = {"step": 0, **{f"eval_{k}": v for k, v in scores.items()}, "best": False}
        metrics.write(record)
        emit("eval", record)

    emit(
        "start",
        {
            "step": step,
            "steps": config.steps,
            "log_every": config.log_every,
            "parameters": sum(p.numel() for p in model.parameters()),
        },
    )
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
        loss, grad_norm = step_fn(
            model,
            task,
            indices,
            accumulation=config.accumulation,
            optimizer=optimizer,
            precision=precision,
            scaler=scaler,
            clip_norm=config.clip_norm,
            device=device,
            context=context,
            step=step,  # 0-based: what a task's random batches (mlm's masks) are drawn for
            checkpointing=config.checkpointing,
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
            scores = evaluate_now()
            last_eval = {f"eval_{k}": v for k, v in scores.items()}
            is_best = stopper.update(scores[metric], step)
            record = {"step": step, **last_eval, "best": is_best}
            metrics.write(record)
            emit("eval", record)

        # Asked of every rank and summed: the ranks stop at the same step, or none does.
        stopping = context.sum(float(should_stop())) > 0
        if step % config.checkpoint_every == 0 or is_best or last or stopper.stopped or stopping:
            metrics.sync()  # the records the checkpoint counts are on disk before it is
            path = _save_checkpoint(
                run,
                step,
                model,
                optimizer,
                scaler,
                sampler,
                stopper,
                window,
                metrics,
                config,
                context,
                digest,
            )
            if is_best and main:
                ckpt.write_pointer(run.checkpoints, ckpt.BEST, path.name)
            if main:
                ckpt.prune(run.checkpoints, config.keep_last)
            emit("checkpoint", {"step": step, "path": str(path), "best": is_best})
        if stopping:
            emit("stopped", {"step": step})
            break

    metrics.close()
    interrupted = step < config.steps and not stopper.stopped
    if interrupted:  # no final weights: the run is not over, its checkpoint resumes it
        return TrainResult(
            step,
            resume.step if resume else None,
            stopper.best,
            stopper.best_step,
            False,
            last_eval,
            run.path,
            distributed.unwrap(model),
            interrupted=True,
            metric=metric,
        )
    weights = distributed.full_state_dict(model, context)  # a collective under FSDP
    if main:
        _finish(
            run,
            task,
            weights,
            metrics.records,
            config,
            metric,
            step,
            stopper,
            last_eval,
            resume,
            started,
            emit,
        )
    context.barrier()
    return TrainResult(
        step,
        resume.step if resume else None,
        stopper.best,
        stopper.best_step,
        stopper.stopped,
        last_eval,
        run.path,
        distributed.unwrap(model),
        metric=metric,
    )


def _save_checkpoint(
    run, step, model, optimizer, scaler, sampler, stopper, window, metrics, config, context, digest
):
    """Everything a resume needs; under FSDP the model and optimizer go to a distributed
    checkpoint, each rank writing its shards."""
    state = {
        "step": step,
        "scaler": scaler.state_dict() if scaler is not None else None,
        "sampler": sampler.state_dict(),
        "rng": context.gather(ckpt.rng_to_tensors(rng_state())),  # one per rank
        "early_stopping": stopper.state_dict(),
        "loss_window": dict(window),
        "metrics_lines": len(metrics),
        "world_size": context.world,
    }
    meta = {
        "step": step,
        "epoch": sampler.epoch,
        "config": config.to_dict(),
        "clearformer": __version__,
        "torch": torch.__version__,
        "world_size": context.world,
        "train_file_sha256": digest,
    }
    if context.sharded:

        def write_shards(folder):
            distributed.save_sharded(folder, model, optimizer)

        return ckpt.save_checkpoint(
            run.checkpoints, step, None, state, meta, context=context, write_shards=write_shards
        )
    state["optimizer"] = optimizer.state_dict()
    weights = distributed.unwrap(model).state_dict()
    return ckpt.save_checkpoint(run.checkpoints, step, weights, state, meta, context=context)


def _finish(
    run, task, weights, records, config, metric, step, stopper, last_eval, resume, started, emit
):
    """The final weights (and what the task exports of them), the summary and the loss
    curve."""
    from safetensors.torch import save as save_safetensors

    from ..io import atomic_write

    with atomic_write(run.path / "model.safetensors", "wb") as handle:
        handle.write(
            save_safetensors({k: v.detach().contiguous().cpu() for k, v in weights.items()})
        )
    export = getattr(task, "export", None)  # mlm: the model in the Hugging Face layout, RUN/hf/
    if export is not None:
        export(weights, run.path)
    plot = write_loss_plot(records, run.path / "loss.png", title=f"clearformer train {config.task}")
    summary = {
        "task": config.task,
        "steps": step,
        "stopped_early": stopper.stopped,
        "metric": metric,
        "best": stopper.best,
        "best_step": stopper.best_step,
        "final": last_eval,
        "resumed_from": resume.step if resume else None,
        "seconds_this_invocation": round(time.perf_counter() - started, 2),
        "loss_plot": plot,
    }
    run.write_json("summary.json", summary)
    emit("done", summary)


def _repair_best_pointer(directory: Path, best_step: int | None) -> None:
    """Point ``best`` at the checkpoint of the restored early stopping's best step: a kill
    after that checkpoint was published and before ``best`` moved to it left the pointer on an
    older one, which the export and the pruning would then take for the best."""
    if best_step is None:
        return
    name = ckpt.checkpoint_name(best_step)
    if (directory / name).is_dir() and ckpt.read_pointer(directory, ckpt.BEST) != name:
        log.info("best: %s (moved on resume)", name)
        ckpt.write_pointer(directory, ckpt.BEST, name)


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
