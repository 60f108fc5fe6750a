"""What a checkpoint's sentence-transformers files ask for: a pooling mode and normalisation
(embedding models), the activation on the scores (cross-encoders).

The pooling mode comes from the pooling module's config (``1_Pooling/config.json``): the legacy
``pooling_mode_*_tokens`` booleans or the newer ``pooling_mode`` string. The pooling itself is
:func:`clearformer.heads.pool`. Normalisation is a ``Normalize`` module in ``modules.json``; the
``Dense`` modules between them are read by :mod:`.st_modules`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...heads import POOLING_MODES
from .files import CheckpointError, CheckpointFiles, read_json

# The sentence-transformers modules clearformer runs (as the last part of their type name);
# the Dense modules' files are read by .st_modules.
SUPPORTED_MODULES = ("Transformer", "Pooling", "Dense", "Normalize")

_LEGACY_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}


@dataclass(frozen=True)
class PoolingConfig:
    """What a sentence-transformers pooling module asks for.

    Attributes:
        mode: one of :data:`clearformer.heads.POOLING_MODES`.
        include_prompt: whether a prompt's tokens count in the pooling (false: they are left
            out, so a prompt steers the encoder without being averaged in).
    """

    mode: str = "mean"
    include_prompt: bool = True


def pooling_from_config(
    config: dict[str, Any] | None, source: str | os.PathLike | None = None
) -> PoolingConfig:
    """The :class:`PoolingConfig` of a pooling module's ``config.json`` (mean pooling, prompt
    included, when there is none); ``source`` is that file, for the errors.

    Raises:
        CheckpointError: a mode clearformer does not implement, several modes at once, no
            mode at all, or an ``include_prompt`` that is not true or false.
    """
    include = (config or {}).get("include_prompt", True)
    if not isinstance(include, bool):
        raise CheckpointError(
            f"{_where(source)} 'include_prompt' must be true or false, got {include!r}"
        )
    return PoolingConfig(pooling_mode_from_config(config, source), include)


def pooling_mode_from_config(
    config: dict[str, Any] | None, source: str | os.PathLike | None = None
) -> str:
    """The pooling mode a sentence-transformers pooling config asks for ("mean" when there is
    no config); ``source`` is that file (``1_Pooling/config.json``), for the errors.

    Raises:
        CheckpointError: a mode clearformer does not implement, several modes at once, or none
            (a config whose ``pooling_mode_*`` keys are all false and that has no
            ``pooling_mode``), naming the file and the keys.
    """
    if not config:
        return "mean"  # what sentence-transformers uses for a plain transformers checkpoint
    supported = f"supported: one of {POOLING_MODES}"
    mode = config.get("pooling_mode")
    if mode is None:
        modes = [name for key, name in _LEGACY_KEYS.items() if config.get(key)]
        if not modes:
            unknown = [k for k, v in config.items() if k.startswith("pooling_mode_") and v]
            also = f" (it sets {', '.join(unknown)}, which clearformer does not know)"
            raise CheckpointError(
                f"{_where(source)} names no pooling mode: none of its keys "
                f"{', '.join(_LEGACY_KEYS)} is true{also if unknown else ''}, and it has no "
                f"'pooling_mode'; {supported}"
            )
        keys = [key for key, name in _LEGACY_KEYS.items() if name in modes]
        where = f"its keys {', '.join(keys)} ask for"
    else:
        if not isinstance(mode, str) and not (
            isinstance(mode, list) and all(isinstance(m, str) for m in mode)
        ):
            raise CheckpointError(
                f"{_where(source)} 'pooling_mode' must be a str or a list of str, got {mode!r}"
            )
        modes = [mode] if isinstance(mode, str) else mode
        where = "its 'pooling_mode' asks for"
    if len(modes) != 1 or modes[0] not in POOLING_MODES:
        what = "several modes at once" if len(modes) > 1 else "a mode clearformer lacks"
        raise CheckpointError(
            f"{_where(source)}: unsupported pooling {modes}: {where} {what}; {supported}"
        )
    return modes[0]


def _where(source: str | os.PathLike | None) -> str:
    return f"the pooling config {source}" if source is not None else "the pooling config"


def normalize_from_modules(modules: list[dict[str, Any]] | None, root: Path) -> bool:
    """Whether sentence-transformers' modules include Normalize (False without modules.json).

    Raises:
        CheckpointError: a module clearformer does not run (an LSTM, say), whose embeddings
            would silently differ.
    """
    if modules is None:
        return False
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    unsupported = [k for k in kinds if k not in SUPPORTED_MODULES]
    if unsupported:
        raise CheckpointError(
            f"{root / 'modules.json'} lists sentence-transformers modules clearformer does not "
            f"run: {unsupported}; supported: {', '.join(SUPPORTED_MODULES)}"
        )
    return "Normalize" in kinds


# sentence-transformers' names of the activations it applies to cross-encoder logits.
_SCORE_ACTIVATIONS = {
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
    "torch.nn.modules.linear.Identity": "identity",
    "torch.nn.modules.activation.Tanh": "tanh",
}


def score_activation(files: CheckpointFiles, num_labels: int) -> str:
    """The activation ``sentence_transformers.CrossEncoder.predict`` applies to this
    checkpoint's logits: the one its files name (``config_sentence_transformers.json``
    ``activation_fn``; older versions: config.json ``sentence_transformers.activation_fn`` or
    ``sbert_ce_default_activation_function``), else sigmoid for one label, identity for more.

    Raises:
        CheckpointError: an activation other than sigmoid, identity or tanh.
    """
    candidates = []
    st_file = files.path / "config_sentence_transformers.json"
    if st_file.is_file():
        st_config = read_json(st_file, "sentence-transformers config")
        if isinstance(st_config, dict):
            candidates.append((st_file, "activation_fn", st_config.get("activation_fn")))
    nested = files.config.get("sentence_transformers")
    config_file = files.path / "config.json"
    if isinstance(nested, dict):
        candidates.append(
            (config_file, "sentence_transformers.activation_fn", nested.get("activation_fn"))
        )
    legacy = "sbert_ce_default_activation_function"
    candidates.append((config_file, legacy, files.config.get(legacy)))
    for source, key, value in candidates:
        if value is None:
            continue
        if value not in _SCORE_ACTIVATIONS:
            raise CheckpointError(
                f"{source} {key!r}={value!r} is not supported; supported: "
                f"{', '.join(_SCORE_ACTIVATIONS)}"
            )
        return _SCORE_ACTIVATIONS[value]
    return "sigmoid" if num_labels == 1 else "identity"


@dataclass(frozen=True)
class Prompts:
    """The named prompts of ``config_sentence_transformers.json``.

    Attributes:
        prompts: name -> the text put before every text (``{"query": "query: "}``).
        default: the name applied when ``encode`` is given no prompt (None: no prompt).
    """

    prompts: Mapping[str, str] = field(default_factory=dict)
    default: str | None = None


def prompts_from_files(files: CheckpointFiles | Path) -> Prompts:
    """The checkpoint's named prompts (none when it has no sentence-transformers config);
    ``files`` may be the directory itself (a Router's, which has no checkpoint at its root).

    Raises:
        CheckpointError: ``prompts`` that is not an object of strings, or a
            ``default_prompt_name`` that names none of them.
    """
    root = files.path if isinstance(files, CheckpointFiles) else Path(files)
    st_file = root / "config_sentence_transformers.json"
    if not st_file.is_file():
        return Prompts()
    st_config = read_json(st_file, "sentence-transformers config")
    if not isinstance(st_config, dict):
        return Prompts()
    prompts = st_config.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()
    ):
        raise CheckpointError(
            f"{st_file} 'prompts' must map prompt names to texts, got {prompts!r}"
        )
    default = st_config.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise CheckpointError(
            f"{st_file} 'default_prompt_name' must be one of the prompts "
            f"{sorted(prompts)}, got {default!r}"
        )
    return Prompts(dict(prompts), default)
