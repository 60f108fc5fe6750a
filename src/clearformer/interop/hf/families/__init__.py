"""Checkpoint families as plug-ins: a registry from config.json's ``model_type`` to a
:class:`Family`.

The loader asks the registry for the family of a checkpoint and runs on that family's answers
(config translation, name table, prefixes), so nothing outside a family's own module depends
on which family it is. Adding one is a module that builds a :class:`Family`, plus its line in
``_BUILT_IN`` below (or a :func:`register` call from outside clearformer).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from ..files import CheckpointError
from . import bert, distilbert, gemma3, gte, modernbert, mpnet, nomic_bert, qwen3, xlm_roberta
from .family import ZEROS, Family, HeadLayout, NameTable

__all__ = [
    "FAMILIES",
    "Family",
    "HeadLayout",
    "NameTable",
    "ZEROS",
    "family_for",
    "family_named",
    "register",
]

_REGISTRY: dict[str, Family] = {}
FAMILIES: Mapping[str, Family] = MappingProxyType(_REGISTRY)  # read-only view, kept current


def register(family: Family, *, replace: bool = False) -> Family:
    """Make ``family`` the one loaded for its ``model_type``.

    Raises:
        TypeError: ``family`` is not a :class:`Family`.
        ValueError: its ``model_type`` is registered already (unless ``replace``).
    """
    if not isinstance(family, Family):
        raise TypeError(f"family must be a Family, got {type(family).__name__}")
    if not isinstance(family.model_type, str) or not family.model_type:
        raise ValueError(f"family.model_type must be a non-empty str, got {family.model_type!r}")
    if family.model_type in _REGISTRY and not replace:
        raise ValueError(
            f"a family for model_type={family.model_type!r} is registered already "
            "(pass replace=True to replace it)"
        )
    _REGISTRY[family.model_type] = family
    return family


def family_named(model_type: Any, source: str = "config.json") -> Family:
    """The registered :class:`Family` for ``model_type``.

    Raises:
        CheckpointError: no family is registered for it; the message lists those that are.
    """
    if not isinstance(model_type, str) or model_type not in _REGISTRY:
        raise CheckpointError(
            f"unsupported architecture model_type={model_type!r} in {source}; supported: "
            f"{', '.join(sorted(_REGISTRY))} (MiniLM checkpoints use 'bert')"
        )
    return _REGISTRY[model_type]


def family_for(hf: dict[str, Any], source: str = "config.json") -> Family:
    """The :class:`Family` named by a config.json's ``model_type``.

    Raises:
        CheckpointError: a missing or unsupported ``model_type``.
    """
    return family_named(hf.get("model_type"), source)


_BUILT_IN = (
    *bert.FAMILIES,
    *distilbert.FAMILIES,
    *gemma3.FAMILIES,
    *gte.FAMILIES,
    *modernbert.FAMILIES,
    *mpnet.FAMILIES,
    *nomic_bert.FAMILIES,
    *qwen3.FAMILIES,
    *xlm_roberta.FAMILIES,
)
for _family in _BUILT_IN:
    register(_family)
