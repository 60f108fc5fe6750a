"""The loss curve of a run as a PNG (with matplotlib; without it, the reason instead)."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

log = logging.getLogger(__name__)


def write_loss_plot(records: list[dict], path: Path, *, title: str) -> str:
    """Training loss and evaluation loss (and accuracy, on a second axis) against the step.

    Returns the file written, or why none was ("matplotlib is not installed").
    """
    if importlib.util.find_spec("matplotlib") is None:
        why = "not written: matplotlib is not installed (pip install 'clearformer[train]')"
        log.warning("loss plot %s", why)
        return why
    import matplotlib

    matplotlib.use("Agg")  # no display needed; must precede pyplot
    import matplotlib.pyplot as plt

    from ..io import atomic_write

    train = [(r["step"], r["loss"]) for r in records if "loss" in r]
    evals = [r for r in records if "eval_loss" in r]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    if train:
        ax.plot(*zip(*train, strict=True), label="training loss", color="tab:blue", linewidth=1)
    if evals:
        ax.plot(
            [r["step"] for r in evals],
            [r["eval_loss"] for r in evals],
            "o-",
            label="evaluation loss",
            color="tab:orange",
            markersize=3,
        )
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    accuracy = [(r["step"], r["eval_accuracy"]) for r in evals if "eval_accuracy" in r]
    handles, labels = ax.get_legend_handles_labels()
    if accuracy:
        right = ax.twinx()
        right.plot(
            *zip(*accuracy, strict=True),
            "s--",
            color="tab:green",
            markersize=3,
            label="evaluation accuracy",
        )
        right.set_ylabel("accuracy")
        right.set_ylim(0, 1)
        more_h, more_l = right.get_legend_handles_labels()
        handles, labels = handles + more_h, labels + more_l
    ax.legend(handles, labels, loc="center right")
    fig.tight_layout()
    with atomic_write(path, "wb") as handle:
        fig.savefig(handle, format="png")
    plt.close(fig)
    return str(path)
