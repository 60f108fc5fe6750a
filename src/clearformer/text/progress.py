"""Progress of a long ``encode`` call: a caller's function, a tqdm bar, or log lines."""

from __future__ import annotations

import logging
from collections.abc import Callable

# The lines keep the name of the logger they were always written to (encode's module).
log = logging.getLogger("clearformer.text.encoder")

ProgressFn = Callable[[int, int], None]  # (texts done, texts in all)
LOG_PROGRESS_MIN = 2048  # texts; below this an encode call is short enough to need no progress


def progress_reporter(progress: bool | ProgressFn | None, total: int) -> ProgressFn:
    """What ``encode`` calls as texts finish: ``progress`` itself when it is a function, a tqdm
    bar for True (where tqdm is installed), a log line every tenth of the texts for None on
    long calls, nothing for False or a short call."""
    if callable(progress):
        return progress
    if progress is True:
        try:
            from tqdm.auto import tqdm
        except ImportError:
            pass
        else:
            bar = tqdm(total=total, unit="text", desc="encode")

            def update(done: int, total: int) -> None:
                bar.update(done - bar.n)
                if done >= total:
                    bar.close()

            return update
    if progress is False or (progress is None and total < LOG_PROGRESS_MIN):
        return lambda done, total: None
    step = max(total // 10, 1)
    state = {"next": step}

    def log_progress(done: int, total: int) -> None:
        if done >= state["next"] or done == total:
            log.info("encoded %d / %d texts", done, total)
            state["next"] = done + step

    return log_progress
