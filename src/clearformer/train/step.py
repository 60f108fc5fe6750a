"""One optimizer step and one evaluation: the two computations the loop repeats."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from .distributed import Context, no_sync
from .precision import Precision
from .tasks.base import Scores, Task, batch_at, scored_count


def micro_batches(indices: Sequence[int], accumulation: int) -> list[list[int]]:
    """A step's examples cut into ``accumulation`` micro-batches of (nearly) equal size."""
    n, parts = len(indices), min(accumulation, len(indices))
    bounds = [round(i * n / parts) for i in range(parts + 1)]
    return [list(indices[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def train_step(
    model: nn.Module,
    task: Task,
    indices: Sequence[int],
    *,
    accumulation: int,
    optimizer: torch.optim.Optimizer,
    precision: Precision,
    scaler: torch.amp.GradScaler | None,
    clip_norm: float,
    device: torch.device,
    context: Context | None = None,
    step: int = 0,
    checkpointing: bool = False,
) -> tuple[float, float]:
    """Forward and backward over the step's micro-batches, clip, update.

    Each micro-batch's loss is its summed cross-entropy over the step's example count (or the
    count of positions the task scores: mlm's masked tokens), so the accumulated gradient is
    the gradient of the mean loss over all the step's examples: ``accumulation``
    micro-batches of B / N equal one batch of B, whatever the split. Under DDP / FSDP each
    rank takes its slice of ``indices`` and its loss is multiplied by the world size, because
    the ranks' gradients are averaged, not summed.

    ``step`` (0-based) is what a task's random batches are drawn for; ``checkpointing``
    asks the model's call to recompute its blocks' activations in backward.

    Returns:
        (the step's mean loss over all ranks, the gradient's global L2 norm before clipping).
    """
    context = context or Context()
    optimizer.zero_grad(set_to_none=True)
    total = scored_count(task, indices)  # of the global batch
    summed = 0.0
    # A per-call choice of the model's forward; a model that cannot recompute need not take it.
    options = {"checkpointing": True} if checkpointing else {}
    chunks = micro_batches(context.shard(list(indices)), accumulation)
    for number, chunk in enumerate(chunks, start=1):
        batch = batch_at(task, chunk, step).to(device)
        with no_sync(model, context, last=number == len(chunks)):
            with precision.autocast():
                logits = model(batch, **options)  # (b, L); mlm: (n, V), its masked tokens
            # The loss in fp32 whatever the autocast: bf16 log-softmax loses the small losses.
            # A task with another loss (rerank: binary cross-entropy) sums it itself.
            loss_sum = getattr(task, "loss_sum", None)
            if loss_sum is not None:
                ce = loss_sum(logits, batch)
            else:
                ce = nn.functional.cross_entropy(logits.float(), batch.labels, reduction="sum")
            loss = ce * (context.world / total)
            (scaler.scale(loss) if scaler is not None else loss).backward()
        summed += ce.item()
    if scaler is not None:
        scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
    params = [p for group in optimizer.param_groups for p in group["params"]]
    # max_norm=inf measures without clipping (its scale factor clamps to exactly 1.0).
    norm = nn.utils.clip_grad_norm_(params, clip_norm if clip_norm > 0 else math.inf)
    if hasattr(norm, "full_tensor"):  # FSDP: a DTensor, the same on every rank
        norm = norm.full_tensor()
    if scaler is not None:
        scaler.step(optimizer)  # skipped when the gradients hold inf/NaN
        scaler.update()
    else:
        optimizer.step()
    return context.sum(summed) / total, norm.item()


@torch.no_grad()
def evaluate(
    model: nn.Module,
    task: Task,
    *,
    batch_size: int,
    precision: Precision,
    metrics: tuple[str, ...],
    device: torch.device,
) -> dict[str, float]:
    """The task's metrics and mean loss on its held-out set (eval mode, no gradients)."""
    was_training = model.training
    model.eval()
    scores = Scores(metrics)
    for batch in task.eval_batches(batch_size):
        batch = batch.to(device)
        with precision.autocast():
            logits = model(batch)
        scores.add(logits, batch.labels)
    model.train(was_training)
    return scores.result(len(task.labels))


def build_optimizer(model: nn.Module, config) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only: decaying biases and norm gains toward zero
    only hurts (as nanoGPT's configure_optimizers)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": config.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    options = {"lr": config.lr, "betas": (config.beta1, config.beta2), "eps": config.eps}
    try:
        # One kernel over every parameter instead of a loop of element-wise ops per tensor
        # (on a CPU a sixth of the default step's time at MiniLM's size). Parameters it cannot
        # take (another device, sharded tensors) keep the default implementation.
        return torch.optim.AdamW(groups, fused=True, **options)
    except (RuntimeError, ValueError, TypeError):
        return torch.optim.AdamW(groups, **options)
