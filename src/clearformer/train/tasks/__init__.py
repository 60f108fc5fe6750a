"""Tasks by name: each is a dataset loader, a model (encoder + head) and a metric."""

from __future__ import annotations

from ..config import TASKS, TrainConfig
from .base import Task


def reported_metrics(config: TrainConfig) -> tuple[str, tuple[str, ...]]:
    """(the task's default metric, every metric its evaluations report) for ``config``, known
    before any data is read: a ``metric`` the evaluations will not report is refused before
    any work rather than at the first evaluation. Most tasks report their ``metrics`` and the
    held-out loss; contrastive and rerank say which in this configuration (with ``eval_data``:
    retrieval measures and no loss)."""
    if config.task == "contrastive":
        from .contrastive import ContrastiveTask

        return ContrastiveTask.reported_metrics(config)
    if config.task == "rerank":
        from .rerank import RerankTask

        return RerankTask.reported_metrics(config)
    if config.task == "classify":
        from .classify import ClassifyTask as task
    elif config.task == "digits":
        from .digits import DigitsTask as task
    elif config.task == "mlm":
        from .mlm import MlmTask as task
    elif config.task == "reverse":
        from .reverse import ReverseTask as task
    elif config.task == "translate":
        from .translate import TranslateTask as task
    else:
        raise ValueError(f"task must be one of {TASKS}, got {config.task!r}")
    return task.metric, ("loss", *task.metrics)


def build_task(config: TrainConfig) -> Task:
    """The task ``config.task`` names, its data loaded and checked."""
    if config.task == "digits":
        from .digits import DigitsTask

        return DigitsTask(config)
    if config.task == "classify":
        from .classify import ClassifyTask

        return ClassifyTask(config)
    if config.task == "translate":
        from .translate import TranslateTask

        return TranslateTask(config)
    if config.task == "reverse":
        from .reverse import ReverseTask

        return ReverseTask(config)
    if config.task == "mlm":
        from .mlm import MlmTask

        return MlmTask(config)
    if config.task == "contrastive":
        from .contrastive import ContrastiveTask

        return ContrastiveTask(config)
    if config.task == "rerank":
        from .rerank import RerankTask

        return RerankTask(config)
    raise ValueError(f"task must be one of {TASKS}, got {config.task!r}")


__all__ = ["Task", "build_task", "reported_metrics"]
