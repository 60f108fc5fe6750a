"""The pooling mode a checkpoint asks for (the pooling itself is :func:`clearformer.heads.pool`).

The mode comes from the checkpoint's pooling module config (``1_Pooling/config.json``): the
legacy ``pooling_mode_*_tokens`` booleans or the newer ``pooling_mode`` string.
"""

from __future__ import annotations

from typing import Any

from ..heads import POOLING_MODES
from .checkpoint import CheckpointError

_LEGACY_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}


def pooling_mode_from_config(config: dict[str, Any] | None) -> str:
    """The pooling mode a sentence-transformers pooling config asks for ("mean" when absent).

    Raises:
        CheckpointError: a mode clearformer does not implement, or several modes at once.
    """
    if not config:
        return "mean"  # what sentence-transformers uses for a plain transformers checkpoint
    mode = config.get("pooling_mode")
    if mode is None:
        modes = [name for key, name in _LEGACY_KEYS.items() if config.get(key)]
    else:
        modes = [mode] if isinstance(mode, str) else list(mode)
    if len(modes) != 1 or modes[0] not in POOLING_MODES:
        raise CheckpointError(
            f"unsupported pooling {modes or 'none'} in the pooling config; supported: one of "
            f"{POOLING_MODES}"
        )
    return modes[0]
