"""``lazy_exports``: a package's public names imported from their modules on first use.

A package ``__init__`` that re-exports names from heavy modules (torch, Starlette) would pay
for them at ``import clearformer``; the CLI, for one, reads its defaults without torch. Each
such package lists its names and their modules, and gets a module ``__getattr__`` (PEP 562)
that imports a name's module when the name is first read and keeps the value in the package,
so later reads are plain lookups, and a ``__dir__`` that lists the names before they load.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``, whose ``namespace`` (its
    ``globals()``) gets each name of ``exports`` (name -> module, relative to ``package``) on
    first use."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value  # later lookups skip __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *exports})

    return __getattr__, __dir__
