"""Reading and writing checkpoint tensors: safetensors first, ``.bin`` only through
``torch.load(weights_only=True)`` (which refuses arbitrary pickled objects)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

import torch
from torch import Tensor

from ..io import publish
from .checkpoint import CheckpointError, read_json


def read_tensors(path: Path) -> dict[str, Tensor]:
    """All tensors of a weights file (``.safetensors``, a sharded index, or ``.bin``).

    Raises:
        CheckpointError: the file is corrupt, truncated or not a mapping of names to tensors.
    """
    if path.name.endswith(".index.json"):
        index = read_json(path, "weights index")
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"weights index {path} has no 'weight_map'")
        tensors: dict[str, Tensor] = {}
        for shard in sorted(set(weight_map.values())):
            shard_path = path.parent / str(shard)
            if shard_path.suffix != ".safetensors":
                raise CheckpointError(
                    f"weights index {path} names a shard that is not .safetensors: {shard}"
                )
            if not shard_path.is_file():
                raise CheckpointError(f"weights index {path} names a missing shard: {shard_path}")
            tensors.update(_read_safetensors(shard_path))
        return tensors
    if path.suffix == ".safetensors":
        return _read_safetensors(path)
    return _read_bin(path)


def _read_safetensors(path: Path) -> dict[str, Tensor]:
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device="cpu")
    except Exception as exc:  # safetensors raises its own SafetensorError and others
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointError(
            f"cannot read {path}: {reason} (the file is corrupt or truncated)"
        ) from None


def _read_bin(path: Path) -> dict[str, Tensor]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # UnpicklingError, RuntimeError, EOFError, ...
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointError(
            f"cannot read {path} with torch.load(weights_only=True): {reason}"
        ) from None
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, Tensor) for k, v in state.items()
    ):
        raise CheckpointError(f"{path} must hold a mapping of names to tensors")
    return state


def write_safetensors(tensors: dict[str, Tensor], path: Path) -> None:
    """Write ``tensors`` to ``path`` atomically (temporary file, then ``os.replace``)."""
    from safetensors.torch import save_file

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        save_file({k: v.contiguous() for k, v in tensors.items()}, tmp, metadata={"format": "pt"})
        publish(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
