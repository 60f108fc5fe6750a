"""What a task gives the trainer: its data as batches, a model, and its metrics."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from ..metrics import accuracy, macro_f1


class Task(Protocol):
    """A dataset loader, a head and a metric, behind one interface.

    ``train_lengths[i]`` is example i's length in tokens (the sampler buckets by it);
    ``train_batch(indices)`` collates those examples; ``eval_batches(n)`` yields the held-out
    set in fixed order, ``n`` at a time.

    Optional, for tasks that need them (see :func:`batch_at`, :func:`scored_count`):
    ``train_batch_at(indices, step)``, ``scored_positions(indices)`` and
    ``export(weights, run_dir)`` (what the task writes beside the final weights). A task may
    also define ``run_files() -> {name: bytes}``: files the run folder keeps beside the
    weights (translate: its vocabularies), written atomically; a resume whose task would write
    other contents is refused.
    """

    name: str
    metric: str  # the default metric for the best checkpoint and early stopping
    metrics: tuple[str, ...]  # what an evaluation reports (besides loss)
    labels: tuple[str, ...]
    train_lengths: Sequence[int]

    def build_model(self) -> nn.Module: ...

    def train_batch(self, indices: Sequence[int]) -> Any: ...

    def eval_batches(self, batch_size: int) -> Iterator[Any]: ...

    def describe(self) -> dict[str, Any]: ...


def batch_at(task: Task, indices: Sequence[int], step: int) -> Any:
    """The task's training batch of ``indices`` at optimizer step ``step`` (0-based).

    A task whose batches are random (mlm masks tokens anew at every step) defines
    ``train_batch_at(indices, step)`` and draws from generators seeded by (seed, step,
    example), never from a global one: so a resumed run, any accumulation and any number of
    processes draw the same.
    """
    at = getattr(task, "train_batch_at", None)
    return task.train_batch(indices) if at is None else at(indices, step)


def scored_count(task: Task, indices: Sequence[int]) -> int:
    """What the summed loss of the examples ``indices`` is divided by: their number, or the
    positions the task scores when it says (mlm: the masked tokens, so that the loss is the
    mean per token and its exponential the perplexity)."""
    count = getattr(task, "scored_positions", None)
    return len(indices) if count is None else count(indices)


@dataclass
class Scores:
    """Metrics of a set of predictions; which ones depends on ``names``."""

    names: tuple[str, ...] = ("accuracy",)
    predicted: list[Tensor] = field(default_factory=list)
    target: list[Tensor] = field(default_factory=list)
    loss_sum: float = 0.0

    def add(self, logits: Tensor, labels: Tensor) -> None:
        logits = logits.float()
        self.loss_sum += nn.functional.cross_entropy(logits, labels, reduction="sum").item()
        self.predicted.append(logits.argmax(dim=-1).cpu())
        self.target.append(labels.cpu())

    def result(self, num_labels: int) -> dict[str, float]:
        predicted, target = torch.cat(self.predicted), torch.cat(self.target)
        out = {"loss": self.loss_sum / max(len(target), 1)}
        if "accuracy" in self.names:
            out["accuracy"] = accuracy(predicted, target)
        if "macro_f1" in self.names:
            out["macro_f1"] = macro_f1(predicted, target, num_labels)
        if "perplexity" in self.names:  # of a mean cross-entropy over tokens (mlm)
            loss = out["loss"]
            out["perplexity"] = math.exp(loss) if loss < 709.0 else math.inf  # a float's range
        return out


def stratified_split(
    labels: Sequence[int], fraction: float, seed: int
) -> tuple[list[int], list[int]]:
    """(train, held-out) indices, ``fraction`` of each label held out (at least one of every
    label that has two or more examples), chosen by a generator of its own seed."""
    generator = torch.Generator().manual_seed(seed)
    by_label: dict[int, list[int]] = {}
    for index, label in enumerate(labels):
        by_label.setdefault(int(label), []).append(index)
    train, held = [], []
    for label in sorted(by_label):
        members = by_label[label]
        order = torch.randperm(len(members), generator=generator).tolist()
        n_held = min(max(round(fraction * len(members)), 1), len(members) - 1)
        held += [members[i] for i in order[:n_held]]
        train += [members[i] for i in order[n_held:]]
    return sorted(train), sorted(held)
