"""The ``encode`` options a Ray or Spark adapter is made with, checked where it is made.

Both adapters pass their options on to :meth:`clearformer.TextEncoder.encode` inside each
worker, at its first batch: a wrong one would fail there, in every worker, after each had
loaded the model, as a remote stack trace. So each option is checked here, on construction, by
the checks ``encode`` itself runs, without a model.
"""

from __future__ import annotations

import inspect
from typing import Any

from ..checks import check_bool, check_positive_int
from ..precision.names import check_precision

# encode's keywords an adapter sets itself: the texts come from the batch, and a worker's
# progress is no one's to see (Ray and Spark report a job's progress by batch and task).
SET_BY_THE_ADAPTER = ("self", "texts", "progress")


def check_encode_options(
    normalize: bool | None, precision: str | None, options: dict[str, Any]
) -> None:
    """Raise TypeError or ValueError, naming the option, for anything
    ``TextEncoder.encode(texts, normalize=normalize, precision=precision, **options)`` would
    refuse before reading its texts; and for ``progress``, which an adapter does not take."""
    from ..text import TextEncoder
    from ..text.batching import check_batch_limits
    from ..text.precision_models import OFFERED
    from ..text.workers import check_workers

    if "progress" in options:
        raise TypeError(
            "progress is not an option of a Ray or Spark adapter: each worker embeds its own "
            "batches, and the framework shows the job's progress (Ray's progress bars, "
            "Spark's UI)"
        )
    taken = set(inspect.signature(TextEncoder.encode).parameters) - set(SET_BY_THE_ADAPTER)
    for name in options:
        if name not in taken:
            raise TypeError(f"unknown encode option {name!r}; the options: {sorted(taken)}")
    check_bool(normalize, "normalize", optional=True)
    if precision is not None:
        check_precision(precision, "precision", (*OFFERED, "auto"))
    max_tokens = options.get("max_tokens")
    check_batch_limits(options.get("batch_size"), max_tokens if max_tokens is not None else 1)
    check_workers(options.get("workers"))
    check_bool(options.get("fuse_int8"), "fuse_int8", optional=True)
    check_positive_int(options.get("dimensions"), "dimensions", optional=True)
    for name in ("prompt", "prompt_name"):
        value = options.get(name)
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{name} must be a str or None, got {type(value).__name__}")
