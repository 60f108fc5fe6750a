"""The config as TOML: read with ``tomllib`` (``tomli`` on Python 3.10), written by hand.

The writer needs only what :class:`~.config.TrainConfig` holds (a flat table of str, int,
float and bool), so no TOML-writing dependency is needed; each key gets the field's comment.
"""

from __future__ import annotations

import json
import math
import os
import sys
from argparse import ArgumentTypeError
from dataclasses import fields
from pathlib import Path
from typing import Any

from .config import TrainConfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover -- Python 3.10
    try:
        import tomli as tomllib
    except ModuleNotFoundError:
        tomllib = None


def read_toml(path: str | os.PathLike) -> dict[str, Any]:
    """The table of a TOML file; errors name the file (and the line, for a syntax error)."""
    if tomllib is None:  # pragma: no cover
        raise ValueError(f"reading {path} needs tomli on Python 3.10: pip install tomli")
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"config file not found: {file}")
    try:
        text = file.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{file} is not UTF-8 text (byte offset {exc.start})") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{file} is not valid TOML: {exc}") from None
    nested = [k for k, v in data.items() if isinstance(v, dict)]
    if nested:
        raise ValueError(
            f"{file}: the config is one flat table of fields, got a [{nested[0]}] section"
        )
    return data


def load_config(path: str | os.PathLike, **overrides: Any) -> TrainConfig:
    """A :class:`TrainConfig` from a TOML file, with ``overrides`` on top."""
    data = read_toml(path)
    try:
        return TrainConfig.from_dict({**data, **overrides}, source=str(path))
    except (TypeError, ValueError, ArgumentTypeError) as exc:
        if str(exc).startswith(str(path)):
            raise
        # A field's own message names the field, not the file it came from.
        raise type(exc)(f"{path}: {exc}") from None


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)  # shortest repr that reads back to the same float
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string: JSON's escapes are TOML's
    raise TypeError(f"cannot write {value!r} as TOML")


def dump_toml(config: TrainConfig) -> str:
    """``config`` as TOML text that :func:`load_config` reads back to an equal config."""
    comments = _field_comments()
    lines = ["# clearformer train configuration (clearformer train --config FILE)"]
    for f in fields(config):
        comment = comments.get(f.name)
        line = f"{f.name} = {_value(getattr(config, f.name))}"
        lines.append(f"{line:<32} # {comment}" if comment else line)
    return "\n".join(lines) + "\n"


def _field_comments() -> dict[str, str]:
    """The trailing comment of each field in config.py's source (its one documentation)."""
    import inspect

    from . import config as module

    comments = {}
    for line in inspect.getsource(module.TrainConfig).splitlines():
        name, _, rest = line.strip().partition(":")
        if name.isidentifier() and "#" in rest and "=" in rest:
            comments[name] = rest.split("#", 1)[1].strip()
    return comments
