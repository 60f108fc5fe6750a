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
        """The progress of a checkpoint's run: its best and the evaluations since. The rule is
        this one's: a resume with another ``patience`` or ``min_delta`` applies it from here,
        and ``stopped`` is decided again by it (a run stopped at patience 2 goes on under
        patience 5; 0 never stops). A resume with another mode is refused before this
        (:func:`~.resume.check_early_stopping`): the best so far would compare the wrong way."""
        self.best, self.best_step = state["best"], state["best_step"]
        self.bad_evaluations = state["bad_evaluations"]
        self.stopped = bool(self.patience) and self.bad_evaluations >= self.patience
