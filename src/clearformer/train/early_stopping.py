"""Early stopping and the best score: patience, min_delta, max or min mode."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass


@dataclass
class EarlyStopping:
    """Tracks the best value of a metric; ``stopped`` after ``patience`` evaluations without
    an improvement of more than ``min_delta`` (``patience=0``: never stops)."""

    mode: str = "max"
    patience: int = 0
    min_delta: float = 0.0
    best: float | None = None
    best_step: int | None = None
    bad_evaluations: int = 0
    stopped: bool = False

    def improved(self, value: float) -> bool:
        if math.isnan(value):
            return False
        if self.best is None:
            return True
        if self.mode == "max":
            return value > self.best + self.min_delta
        return value < self.best - self.min_delta

    def update(self, value: float, step: int) -> bool:
        """Record an evaluation; True when it is the new best."""
        if self.improved(value):
            self.best, self.best_step, self.bad_evaluations = value, step, 0
            return True
        self.bad_evaluations += 1
        if self.patience and self.bad_evaluations >= self.patience:
            self.stopped = True
        return False

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state: dict) -> None:
        for key, value in state.items():
            setattr(self, key, value)
