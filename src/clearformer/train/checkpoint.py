"""Checkpoints that never lose work.

A checkpoint is a folder ``checkpoints/step-00000100/`` holding

* ``model.safetensors`` -- the weights;
* ``state.pt`` -- optimizer, grad scaler, sampler (its generator at the epoch's start and the
  batches taken since), every RNG, early stopping, the step and the metrics log's length;
* ``meta.json`` -- step, epoch, the resolved config, library and torch versions;
* ``COMPLETE`` -- written last: the SHA-256 of each file above.

Under FSDP the model and optimizer are instead a ``torch.distributed.checkpoint`` folder
``dcp/`` (each rank writes its shards; rank 0 writes the rest and finishes the folder).

It is written into a hidden temporary folder, every file fsynced, the marker last, then the
folder is renamed into place (one atomic step) and the directory fsynced; only then does the
``latest`` pointer move to it. So a kill at any moment leaves either the new checkpoint
complete or none of it under a real name, and the previous checkpoint untouched. Loading
verifies the marker's checksums, and a damaged newest checkpoint falls back to the one
before, with a warning.

Fault injection for the tests: ``CLEARFORMER_CHECKPOINT_FAULT=<stage>@<step>`` makes the
writer of that step's checkpoint ``os._exit(17)`` at ``stage``: ``weights`` (half the
weights file written), ``marker`` (all files written, no marker), ``rename`` (renamed, the
``latest`` pointer not yet moved).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..io import atomic_write, fsync_directory

log = logging.getLogger(__name__)

MARKER = "COMPLETE"
LATEST = "latest"
BEST = "best"
_NAME = re.compile(r"^step-(\d{8})$")
FAULT_ENV = "CLEARFORMER_CHECKPOINT_FAULT"


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: incomplete, damaged or of another model."""


@dataclass
class Checkpoint:
    path: Path
    step: int
    weights: dict[str, Tensor] | None  # None: sharded, in path / "dcp"
    state: dict[str, Any]
    meta: dict[str, Any]


def checkpoint_name(step: int) -> str:
    return f"step-{step:08d}"


def _fault(stage: str, step: int) -> bool:
    return os.environ.get(FAULT_ENV) == f"{stage}@{step}"


def _write_file(path: Path, data: bytes, *, stop_half_way: bool = False) -> None:
    with open(path, "wb") as handle:
        if stop_half_way:  # fault injection: a process killed in the middle of a write
            handle.write(data[: len(data) // 2])
            handle.flush()
            os.fsync(handle.fileno())
            os._exit(17)
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def save_checkpoint(
    directory: Path,
    step: int,
    weights: dict[str, Tensor] | None,
    state: dict[str, Any],
    meta: dict[str, Any],
    *,
    context: Any = None,
    write_shards: Callable[[Path], None] | None = None,
) -> Path:
    """Write a complete checkpoint of ``step`` under ``directory`` and point ``latest`` at it.

    Args:
        weights: the model's tensors (None when ``write_shards`` writes them).
        context: the :class:`~.distributed.Context`; rank 0 writes, the others wait.
        write_shards: called on every rank with the folder for its shards (FSDP's
            distributed checkpoint, model and optimizer), before rank 0 finishes the folder.
    """
    main = context is None or context.is_main
    barrier = context.barrier if context is not None else (lambda: None)
    name = checkpoint_name(step)
    tmp = directory / f".tmp-{name}"  # one path for every rank
    if main:
        directory.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    barrier()
    if write_shards is not None:
        write_shards(tmp / "dcp")
        barrier()
    final = directory / name
    if main:
        _write_folder(tmp, step, weights, state, meta)
        _publish(directory, tmp, final, step)
    barrier()
    return final


def _write_folder(tmp: Path, step: int, weights, state, meta) -> None:
    from safetensors.torch import save as save_safetensors

    buffer = io.BytesIO()
    torch.save(state, buffer)
    contents = {
        "state.pt": buffer.getvalue(),
        "meta.json": json.dumps(meta, indent=1, sort_keys=True).encode(),
    }
    if weights is not None:
        # safetensors wants contiguous tensors that share no memory.
        contents["model.safetensors"] = save_safetensors(
            {k: v.detach().contiguous().cpu() for k, v in weights.items()}
        )
    for file in sorted(contents, key=lambda f: f != "model.safetensors"):  # weights first
        half = file == "model.safetensors" and _fault("weights", step)
        _write_file(tmp / file, contents[file], stop_half_way=half)
    if _fault("marker", step):
        os._exit(17)
    sums = {
        str(p.relative_to(tmp)): _sha256(p.read_bytes())
        for p in sorted(tmp.rglob("*"))
        if p.is_file()
    }
    marker = {"step": step, "sha256": sums}
    _write_file(tmp / MARKER, json.dumps(marker, indent=1).encode())  # last: says "complete"
    for folder in {p.parent for p in tmp.rglob("*")} | {tmp}:
        fsync_directory(folder)


def _publish(directory: Path, tmp: Path, final: Path, step: int) -> None:
    """Rename the finished folder into place, then move ``latest`` to it."""
    if final.exists():
        # The same step again (a damaged copy left from before): move it aside first, since a
        # folder cannot be renamed onto a non-empty one.
        aside = directory / f".old-{final.name}"
        shutil.rmtree(aside, ignore_errors=True)
        os.rename(final, aside)
        os.rename(tmp, final)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.rename(tmp, final)
    fsync_directory(directory)
    if _fault("rename", step):
        os._exit(17)
    write_pointer(directory, LATEST, final.name)


def write_pointer(directory: Path, pointer: str, name: str) -> None:
    """``latest`` / ``best``: a one-line file naming a complete checkpoint folder."""
    with atomic_write(directory / pointer) as handle:
        handle.write(name + "\n")


def read_pointer(directory: Path, pointer: str) -> str | None:
    with contextlib.suppress(OSError, UnicodeDecodeError):
        return (directory / pointer).read_text(encoding="utf-8").strip() or None
    return None


def complete_checkpoints(directory: Path) -> list[Path]:
    """Checkpoint folders with a completion marker, newest (highest step) first.

    A folder is listed by its marker alone; its files are verified when it is loaded.
    """
    if not directory.is_dir():
        return []
    found = []
    for path in directory.iterdir():
        match = _NAME.match(path.name)
        if match and (path / MARKER).is_file():
            found.append((int(match.group(1)), path))
    return [path for _, path in sorted(found, reverse=True)]


def remove_partial(directory: Path) -> None:
    """Remove what killed writers left: hidden temporary folders (never a complete one)."""
    if not directory.is_dir():
        return
    for path in directory.iterdir():
        if path.name.startswith((".tmp-step-", ".old-step-")) and path.is_dir():
            log.info("removing the unfinished checkpoint write %s", path)
            shutil.rmtree(path, ignore_errors=True)


def load_checkpoint(path: Path) -> Checkpoint:
    """A checkpoint folder, every file checked against its marker's checksum.

    The weights are loaded when the folder has ``model.safetensors``; a sharded checkpoint
    (``dcp/``, FSDP) is loaded later, by every rank, from ``Checkpoint.path / "dcp"``.

    Raises:
        CheckpointError: no marker, a missing file, a checksum that does not match, or a file
            that cannot be parsed; the message names the file.
    """
    from safetensors.torch import load as load_safetensors

    try:
        marker = json.loads((path / MARKER).read_text(encoding="utf-8"))
        sums = dict(marker["sha256"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{path / MARKER}: not a valid completion marker ({exc})") from None
    needed = ["state.pt", "meta.json"]
    needed.append("dcp/.metadata" if "dcp/.metadata" in sums else "model.safetensors")
    data = {}
    for file in sorted(set(sums) | set(needed)):
        try:
            data[file] = (path / file).read_bytes()
        except OSError as exc:
            raise CheckpointError(f"{path / file}: cannot read ({exc.strerror})") from None
        if _sha256(data[file]) != sums.get(file):
            raise CheckpointError(
                f"{path / file}: damaged (its SHA-256 differs from the one recorded in {MARKER})"
            )
    try:
        weights = (
            load_safetensors(data["model.safetensors"]) if "model.safetensors" in data else None
        )
        state = torch.load(io.BytesIO(data["state.pt"]), weights_only=True)
        meta = json.loads(data["meta.json"])
    except Exception as exc:  # a parser's own error type; the checksum matched, so rare
        raise CheckpointError(f"{path}: cannot be read ({type(exc).__name__}: {exc})") from None
    return Checkpoint(path, int(meta["step"]), weights, state, meta)


def load_newest(directory: Path) -> Checkpoint | None:
    """The newest checkpoint that loads; damaged newer ones are skipped with a warning.

    Returns None when there is no checkpoint at all.

    Raises:
        CheckpointError: checkpoints exist but none of them loads.
    """
    candidates = complete_checkpoints(directory)
    latest = read_pointer(directory, LATEST)
    if latest and candidates and candidates[0].name != latest:
        # A kill between the rename and the pointer's update: the folder is complete.
        log.info("latest names %s, but %s is newer and complete", latest, candidates[0].name)
    errors = []
    for path in candidates:
        try:
            checkpoint = load_checkpoint(path)
        except CheckpointError as exc:
            log.warning("skipping a damaged checkpoint: %s", exc)
            errors.append(str(exc))
            continue
        if errors:
            log.warning("resuming from the previous complete checkpoint, %s", path.name)
        return checkpoint
    if errors:
        raise CheckpointError(
            f"no checkpoint in {directory} can be loaded ({errors[0]}); remove the folder to "
            "start over, or choose another --out"
        )
    return None


def prune(directory: Path, keep_last: int) -> list[Path]:
    """Delete complete checkpoints beyond the newest ``keep_last``, never the best one.

    The newest is always kept (``keep_last >= 1``); the best is the one ``best`` names.
    """
    keep_last = max(keep_last, 1)
    best = read_pointer(directory, BEST)
    removed = []
    for path in complete_checkpoints(directory)[keep_last:]:
        if path.name == best:
            continue
        shutil.rmtree(path)
        removed.append(path)
    return removed


def rng_to_tensors(state: dict) -> dict:
    """RNG states in types ``torch.load(weights_only=True)`` reads (no pickled NumPy arrays),
    so that loading a checkpoint never runs code from it."""
    kind, keys, pos, has_gauss, cached = state["numpy"]
    out = dict(state)
    out["numpy"] = {
        "kind": kind,
        "keys": torch.from_numpy(keys.astype("int64")),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached": float(cached),
    }
    return out


def rng_from_tensors(state: dict) -> dict:
    import numpy as np

    numpy = state["numpy"]
    out = dict(state)
    out["numpy"] = (
        numpy["kind"],
        numpy["keys"].numpy().astype(np.uint32),
        numpy["pos"],
        numpy["has_gauss"],
        numpy["cached"],
    )
    return out
