"""Training: a thin loop over small parts, each one concept.

* :mod:`.config` -- :class:`TrainConfig`, the one dataclass of a run (TOML: :mod:`.tomlfile`);
* :mod:`.loop` -- :func:`train`, the loop itself;
* :mod:`.step` -- one optimizer step (accumulation, clipping, autocast) and one evaluation;
* :mod:`.schedule` -- warm-up then cosine/linear decay, a pure function of the step;
* :mod:`.sampler`, :mod:`.collate` -- length-bucketed resumable batches; padded and packed;
* :mod:`.tasks` -- ``digits`` and ``classify``: data, model and metric;
* :mod:`.checkpoint`, :mod:`.resume` -- checkpoints that never lose work, and resuming;
* :mod:`.early_stopping`, :mod:`.precision`, :mod:`.rng`, :mod:`.metrics`, :mod:`.plots`.

Names are imported on first use (as the package root does), so that the CLI can build its
flags from :class:`TrainConfig` without importing torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy_exports import lazy_exports as _lazy_exports

_EXPORTS = {
    "TrainConfig": ".config",
    "TrainResult": ".loop",
    "train": ".loop",
    "dump_toml": ".tomlfile",
    "load_config": ".tomlfile",
}

__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS, globals())

if TYPE_CHECKING:
    from .config import TrainConfig
    from .loop import TrainResult, train
    from .tomlfile import dump_toml, load_config


__all__ = ["TrainConfig", "TrainResult", "dump_toml", "load_config", "train"]
