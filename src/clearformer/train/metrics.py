"""Classification metrics from predicted and true label ids (no scikit-learn needed)."""

from __future__ import annotations

import torch
from torch import Tensor


def confusion_matrix(predicted: Tensor, target: Tensor, num_labels: int) -> Tensor:
    """(L, L) counts: row = true label, column = predicted label."""
    flat = target.long() * num_labels + predicted.long()
    return torch.bincount(flat, minlength=num_labels * num_labels).reshape(num_labels, num_labels)


def accuracy(predicted: Tensor, target: Tensor) -> float:
    return (predicted == target).double().mean().item() if target.numel() else 0.0


def macro_f1(predicted: Tensor, target: Tensor, num_labels: int) -> float:
    """Unweighted mean of per-label F1 over the labels that occur (true or predicted), as
    scikit-learn's ``f1_score(average="macro")`` with ``labels`` left to the data."""
    counts = confusion_matrix(predicted, target, num_labels).double()
    tp = counts.diag()
    predicted_n, true_n = counts.sum(0), counts.sum(1)
    present = (predicted_n + true_n) > 0
    f1 = torch.where(present, 2 * tp / (predicted_n + true_n).clamp(min=1), 0.0)
    return (f1[present].mean().item()) if present.any() else 0.0
