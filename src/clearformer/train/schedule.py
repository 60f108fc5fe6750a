"""The learning-rate schedule: linear warm-up, then cosine, linear or no decay.

A pure function of the step (as nanoGPT's ``get_lr``): nothing to save but the step, so a
resumed run cannot drift from an uninterrupted one, and the tests hold it to closed forms.
"""

from __future__ import annotations

import math


def learning_rate(
    step: int,
    *,
    lr: float,
    warmup_steps: int,
    total_steps: int,
    decay: str = "cosine",
    min_lr_ratio: float = 0.0,
) -> float:
    """The learning rate of optimizer step ``step`` (0-based).

    * warm-up, ``step < warmup_steps``: ``lr * (step + 1) / warmup_steps`` (the first step
      already moves, the last warm-up step reaches ``lr``);
    * then, with ``p = (step - warmup_steps) / (total_steps - warmup_steps)`` going from 0 to
      (nearly) 1 and ``floor = min_lr_ratio * lr``: cosine ``floor + (lr - floor) *
      (1 + cos(pi p)) / 2``, linear ``lr - (lr - floor) p``, constant ``lr``.
    """
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    floor = min_lr_ratio * lr
    span = max(total_steps - warmup_steps, 1)
    p = min((step - warmup_steps) / span, 1.0)
    if decay == "cosine":
        return floor + (lr - floor) * 0.5 * (1.0 + math.cos(math.pi * p))
    if decay == "linear":
        return lr - (lr - floor) * p
    if decay == "constant":
        return lr
    raise ValueError(f"decay must be one of ('cosine', 'linear', 'constant'), got {decay!r}")
