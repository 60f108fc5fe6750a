"""Resuming: is the checkpoint's run this one, and put every piece of state back."""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import torch
from torch import nn

from .checkpoint import Checkpoint, CheckpointError, rng_from_tensors
from .config import (
    DATA_ORDER_FIELDS,
    HARMLESS_FIELDS,
    METRIC_FIELDS,
    SHAPE_FIELDS,
    TrainConfig,
    changed_fields,
)
from .distributed import Context, load_sharded, unwrap
from .early_stopping import EarlyStopping
from .rng import seed_everything, set_rng_state
from .sampler import EpochSampler

log = logging.getLogger(__name__)


def train_file_digest(config: TrainConfig) -> str | None:
    """The SHA-256 of ``config.train_file``'s bytes (None where it names no file, such as a
    bundled data set): checkpoints record it, so that a resume sees the same rows."""
    path = Path(config.train_file) if config.train_file else None
    if path is None or not path.is_file():
        return None
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_resume(checkpoint: Checkpoint, config: TrainConfig, digest: str | None = None) -> None:
    """Refuse a resume that cannot go on with the same run; warn about changes that can.

    ``digest``: :func:`train_file_digest` of ``config`` (checked against the checkpoint's,
    where it recorded one).

    Raises:
        CheckpointError: the config changes the model's shape or the data order (naming each
            field, the checkpoint's value and this one), or the train file's rows changed.
    """
    recorded = checkpoint.meta.get("train_file_sha256")
    if recorded is not None and digest is not None and recorded != digest:
        raise CheckpointError(
            f"cannot resume {checkpoint.path.parent.parent}: train_file {config.train_file} "
            f"changed since the checkpoint (sha256 {recorded[:12]}... then, {digest[:12]}... "
            f"now): its rows would not be the ones the sampler's position counts; resume with "
            f"the file the run started with, or give another --out"
        )
    changed = changed_fields(checkpoint.meta.get("config", {}), config)
    if not changed:
        return
    where = checkpoint.path.parent.parent
    sharded_then = checkpoint.weights is None
    if sharded_then != (config.distributed == "fsdp"):
        then = "fsdp" if sharded_then else "none or ddp"
        raise CheckpointError(
            f"cannot resume {where}: its checkpoints were written with distributed={then!r} "
            f"(the other checkpoint format), got distributed={config.distributed!r}"
        )
    refused = {k: v for k, v in changed.items() if k in SHAPE_FIELDS + DATA_ORDER_FIELDS}
    if refused:
        said = ", ".join(
            f"{k}: {old!r} in the checkpoint, {new!r} now" for k, (old, new) in refused.items()
        )
        kind = "the model's shape" if set(refused) & set(SHAPE_FIELDS) else "the data order"
        raise CheckpointError(
            f"cannot resume {where}: the config changes {kind} ({said}); use the run's "
            f"config ({where / 'config.toml'}) or another --out"
        )
    harmless = {k: v for k, v in changed.items() if k in HARMLESS_FIELDS}
    other = {k: v for k, v in changed.items() if k not in HARMLESS_FIELDS}
    for name, (old, new) in harmless.items():
        effect = (
            ": the best score so far was measured with the old value, later ones with the new"
            if name in METRIC_FIELDS
            else ""
        )
        log.warning("resuming with %s=%r (the checkpoint's run had %r)%s", name, new, old, effect)
    for name, (old, new) in other.items():
        if name in ("metric", "mode"):
            continue  # check_early_stopping refuses a change of either that means one
        if name in ("patience", "min_delta"):
            log.warning(
                "resuming with %s=%r (the checkpoint's run had %r): early stopping goes on "
                "under it, the evaluations since the best so far counted",
                name,
                new,
                old,
            )
            continue
        log.warning(
            "resuming with %s=%r (the checkpoint's run had %r): the steps from here differ "
            "from an uninterrupted run of either config",
            name,
            new,
            old,
        )


def check_early_stopping(checkpoint: Checkpoint, metric: str, mode: str, default: str) -> None:
    """Refuse a resume that changes what the best checkpoint is chosen by: the metric (the
    config's, else the task's ``default``) or its direction. The best so far is a value of
    the old metric, compared the old way: early stopping and the ``best`` pointer would go on
    comparing it with values of another kind (``patience`` and ``min_delta`` may change: they
    apply from the resume on).

    Raises:
        CheckpointError: naming the checkpoint's metric and mode and this config's.
    """
    then_config = checkpoint.meta.get("config", {})
    # The task's default is the same then and now: task and eval_data cannot change on resume.
    then_metric = then_config.get("metric", "") or default
    then_mode = checkpoint.state["early_stopping"]["mode"]
    if (then_metric, then_mode) == (metric, mode):
        return
    where = checkpoint.path.parent.parent
    raise CheckpointError(
        f"cannot resume {where}: its best checkpoint was chosen by metric={then_metric!r}, "
        f"mode={then_mode!r}, got metric={metric!r}, mode={mode!r}: the best so far would be "
        f"compared with values of another kind; use the run's metric and mode, or another --out"
    )


def restore(
    checkpoint: Checkpoint,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None,
    sampler: EpochSampler,
    stopper: EarlyStopping,
    context: Context,
    seed: int,
) -> tuple[int, dict]:
    """Load every piece of state; returns (step, the training-loss window)."""
    state = checkpoint.state
    if checkpoint.weights is None:  # sharded: every rank reads its part, whatever the world
        load_sharded(checkpoint.path / "dcp", model, optimizer)
    else:
        try:
            unwrap(model).load_state_dict(checkpoint.weights, strict=True)
        except RuntimeError as exc:
            raise CheckpointError(
                f"{checkpoint.path / 'model.safetensors'} does not fit this model: "
                f"{str(exc).splitlines()[0]}"
            ) from None
        optimizer.load_state_dict(state["optimizer"])
    if scaler is not None and state["scaler"] is not None:
        scaler.load_state_dict(state["scaler"])
    sampler.load_state_dict(state["sampler"])
    stopper.load_state_dict(state["early_stopping"])
    # Last: building the model above drew from the global generators.
    per_rank = state["rng"]
    if len(per_rank) == context.world:
        set_rng_state(rng_from_tensors(per_rank[context.rank]))
    else:
        # Dropout draws of N ranks cannot be dealt to M: the data order and every tensor are
        # the checkpoint's, the dropout masks from here on are new (and still seeded).
        log.warning(
            "resuming %d processes from a checkpoint of %d: dropout draws restart from a seed",
            context.world,
            len(per_rank),
        )
        seed_everything(seed + 1_000_003 * context.rank + int(state["step"]))
    log.info("resumed from %s (step %d)", checkpoint.path, checkpoint.step)
    return int(state["step"]), dict(state["loss_window"])
