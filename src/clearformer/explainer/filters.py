"""The ``layer`` / ``head`` / ``step`` / ``sequence`` filters shared by the renderers and the CLI.

They are checked against the model's size before anything runs, so a bad filter fails fast.
"""

from __future__ import annotations

from dataclasses import dataclass

from .steps import STEP_NAMES


@dataclass(frozen=True)
class Filters:
    layer: int | None = None
    head: int | None = None
    step: str | None = None
    sequence: int = 0

    def keeps(self, name: str, layer: int | None) -> bool:
        if self.layer is not None and layer != self.layer:
            return False
        return self.step is None or matches(self.step, name)


def matches(pattern: str, name: str) -> bool:
    """``attn.scores`` matches ``attn.scores``, ``scores`` and ``attn``."""
    return name == pattern or pattern in name.split(".") or name.startswith(pattern + ".")


def check_filters(
    filters: Filters, *, n_layers: int, n_heads: int, batch: int | None = None
) -> Filters:
    """Raise ValueError naming the filter, the allowed range and the value given."""
    if filters.layer is not None and not 0 <= filters.layer < n_layers:
        raise ValueError(
            f"--layer must be in [0, {n_layers - 1}] (the model has {n_layers} layers), "
            f"got {filters.layer}"
        )
    if filters.head is not None and not 0 <= filters.head < n_heads:
        raise ValueError(
            f"--head must be in [0, {n_heads - 1}] (the model has {n_heads} heads), "
            f"got {filters.head}"
        )
    if filters.step is not None and not any(matches(filters.step, n) for n in STEP_NAMES):
        raise ValueError(
            f"--step must name a step or a group of steps (e.g. 'attn', 'scores', "
            f"'attn.weights'), got {filters.step!r}; steps: {', '.join(STEP_NAMES)}"
        )
    if batch is not None and not 0 <= filters.sequence < batch:
        raise ValueError(
            f"--sequence must be in [0, {batch - 1}] (the batch has {batch} sequences), "
            f"got {filters.sequence}"
        )
    return filters
