"""Reading and writing checkpoint tensors: safetensors first, ``.bin`` only through
``torch.load(weights_only=True)`` (which refuses arbitrary pickled objects).

Two ways to read: :func:`read_tensors` returns every tensor at once (for the heads and modules
that want a plain dict); :func:`open_tensors` reads safetensors lazily, one tensor when it is
asked for, so that loading a model holds the model and a tensor at a time rather than the model
and the whole checkpoint.
"""

from __future__ import annotations

import logging
import pickle
import re
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TypeVar

import torch
from torch import Tensor

from ...io import atomic_write
from .files import CheckpointError, read_json
from .safetensors_file import StoredTensor, damaged, read_header

log = logging.getLogger(__name__)

SHARD_SUFFIXES = (".safetensors", ".bin")
# Bytes of the file's dtype read at a time where a tensor is converted as it is copied.
CONVERT_BLOCK_BYTES = 16 * 2**20

# What a shard reader gives for each name: a tensor, or where to read one (StoredTensor).
_Entry = TypeVar("_Entry")


def read_tensors(path: Path) -> dict[str, Tensor]:
    """All tensors of a weights file (``.safetensors``, ``.bin``, or a sharded index of either).

    Raises:
        CheckpointError: the file is corrupt, truncated or not a mapping of names to tensors; or
            an index and its shards disagree.
    """
    if path.name.endswith(".index.json"):
        return _merge_shards(path, _read_file)
    return _read_file(path)


def open_tensors(path: Path) -> CheckpointTensors:
    """The tensors of a weights file (or a sharded index), read when asked for: safetensors
    files are only parsed and checked here, ``.bin`` files are read whole (``torch.load``
    cannot read one tensor of a file).

    Raises:
        CheckpointError: as :func:`read_tensors`, for everything a file's header or an index
            can tell before any tensor data is read.
    """
    if path.name.endswith(".index.json"):
        return CheckpointTensors(_merge_shards(path, _open_file))
    return CheckpointTensors(_open_file(path))


class CheckpointTensors(Mapping[str, Tensor]):
    """A checkpoint's tensors by name, each either in memory or read from its file on access.

    Indexing reads a whole tensor; :meth:`shape` answers without reading, and
    :meth:`copy_into` fills a parameter (or a block of its rows) straight from the file.
    Wrapping a plain dict of tensors gives the same interface at no cost.
    """

    def __init__(self, entries: Mapping[str, Tensor | StoredTensor]):
        self._entries = dict(entries)

    def __getitem__(self, name: str) -> Tensor:
        entry = self._entries[name]
        return entry.read() if isinstance(entry, StoredTensor) else entry

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._entries[name].shape)

    def without(self, names: Iterable[str]) -> CheckpointTensors:
        """The same tensors but ``names`` (none is read)."""
        dropped = set(names)
        return CheckpointTensors({k: v for k, v in self._entries.items() if k not in dropped})

    def renamed(self, rename: Callable[[str], str]) -> CheckpointTensors:
        """The same tensors under the names ``rename`` gives (none is read)."""
        return CheckpointTensors({rename(name): entry for name, entry in self._entries.items()})

    def copy_into(
        self, name: str, destination: Tensor, rows: tuple[int, int] | None = None
    ) -> None:
        """Copy tensor ``name`` (or rows ``[first, stop)`` of its first axis) into
        ``destination``, converting the dtype as ``Tensor.copy_`` does. Where the stored dtype
        is the destination's, the bytes are read into it in place, with no buffer."""
        entry = self._entries[name]
        if not isinstance(entry, StoredTensor):
            destination.copy_(entry if rows is None else entry[rows[0] : rows[1]])
        elif (
            entry.dtype == destination.dtype
            and destination.is_contiguous()
            and destination.device.type == "cpu"
        ):
            entry.read_into(destination, rows)
        elif destination.dim() == 0 or destination.numel() == 0:
            destination.copy_(entry.read(rows))
        else:
            # Converted block by block of rows: a model filled in another dtype (bfloat16 from
            # a float32 file) never holds a whole float32 tensor (an embedding table) besides.
            first, stop = rows if rows is not None else (0, entry.shape[0])
            row_bytes = max(1, destination[0].numel() * entry.dtype.itemsize)
            step = max(1, CONVERT_BLOCK_BYTES // row_bytes)
            for at in range(first, stop, step):
                end = min(stop, at + step)
                destination[at - first : end - first].copy_(entry.read((at, end)))


def _read_file(path: Path) -> dict[str, Tensor]:
    if path.suffix == ".safetensors":
        return _read_safetensors(path)
    return _read_bin(path)


def _open_file(path: Path) -> Mapping[str, Tensor | StoredTensor]:
    if path.suffix == ".safetensors":
        return read_header(path)
    return _read_bin(path)


def _merge_shards(
    index_path: Path, read_shard: Callable[[Path], Mapping[str, _Entry]]
) -> dict[str, _Entry]:
    """The entries (tensors, or where they lie) of every shard an index names, checked
    against its ``weight_map``.

    The weight_map says which shard holds each tensor; a shard lacking one of its tensors, or
    two shards holding the same name, means the files do not belong together, so either is an
    error rather than a silently missing or overwritten weight.
    """
    shards = _shards_of(index_path)
    tensors: dict[str, _Entry] = {}
    origin: dict[str, str] = {}
    for shard, expected in shards.items():
        found = read_shard(index_path.parent / shard)
        absent = sorted(set(expected) - set(found))
        if absent:
            raise CheckpointError(
                f"shard {index_path.parent / shard} lacks tensor {absent[0]!r}, which the "
                f"weight_map of {index_path} assigns to it ({len(absent)} missing in all)"
            )
        for name, tensor in found.items():
            if name in origin:
                raise CheckpointError(
                    f"tensor {name!r} is in two shards of {index_path}: {origin[name]} and "
                    f"{shard}; a name must be in exactly one shard"
                )
            origin[name] = shard
            tensors[name] = tensor
        unlisted = sorted(set(found) - set(expected))
        if unlisted:
            log.warning(
                "shard %s holds %d tensors its index %s does not list, e.g. %r",
                index_path.parent / shard,
                len(unlisted),
                index_path,
                unlisted[0],
            )
    return tensors


def _shards_of(index_path: Path) -> dict[str, list[str]]:
    """Shard file name -> the tensor names the index's ``weight_map`` assigns to it, after
    checking each shard is a ``.safetensors`` or ``.bin`` file beside the index."""
    index = read_json(index_path, "weights index")
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"weights index {index_path} has no 'weight_map'")
    shards: dict[str, list[str]] = {}
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or Path(shard).name != shard or shard in (".", ".."):
            raise CheckpointError(
                f"weights index {index_path} maps {name!r} to {shard!r}; expected the file name "
                "of a shard in the same directory"
            )
        shards.setdefault(shard, []).append(name)
    # A safetensors index names safetensors shards only, so that preferring safetensors never
    # ends in torch.load; a .bin index names .bin shards.
    kind = Path(index_path.name.removesuffix(".index.json")).suffix
    allowed = (kind,) if kind in SHARD_SUFFIXES else SHARD_SUFFIXES
    for shard in sorted(shards):
        if Path(shard).suffix not in allowed:
            raise CheckpointError(
                f"weights index {index_path} names shard {shard!r} with suffix "
                f"{Path(shard).suffix!r}; expected {' or '.join(allowed)}"
            )
        if not (index_path.parent / shard).is_file():
            raise CheckpointError(
                f"weights index {index_path} names a missing shard: {index_path.parent / shard}"
            )
    return dict(sorted(shards.items()))


def _read_safetensors(path: Path) -> dict[str, Tensor]:
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device="cpu")
    except Exception as exc:  # safetensors raises its own SafetensorError and others
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise damaged(path, reason) from None


def _read_bin(path: Path) -> dict[str, Tensor]:
    try:
        with warnings.catch_warnings():
            # A raw (non-zip) pickle of another protocol makes torch warn that its safe
            # unpickler "might not support all instructions" before it refuses or reads the
            # file; the outcome is reported below, so that one warning is noise here.
            warnings.filterwarnings(
                "ignore", message="Detected pickle protocol", category=UserWarning
            )
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(_refused_pickle(path, str(exc))) from None
    except Exception as exc:  # RuntimeError, EOFError, ...
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointError(
            f"cannot read {path} with torch.load(weights_only=True): {reason}"
        ) from None
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, Tensor) for k, v in state.items()
    ):
        raise CheckpointError(f"{path} must hold a mapping of names to tensors")
    return state


def _refused_pickle(path: Path, torch_message: str) -> str:
    """What was found and that it will not be loaded. torch's own message advises retrying
    with ``weights_only=False``, which runs whatever code the file holds: never repeated."""
    found = re.search(
        r"WeightsUnpickler error:\s*(.+?)(?: was not an allowed global|\n|$)", torch_message
    )
    what = f" ({' '.join(found.group(1).split())})" if found else ""
    return (
        f"cannot read {path} with torch.load(weights_only=True): it holds pickled Python "
        f"objects other than tensors{what}; "
        "clearformer will not load it, since unpickling such objects can run arbitrary code. "
        "If you trust its source, convert it to model.safetensors with a trusted tool (the "
        "safetensors project's convert script, or transformers' "
        "save_pretrained(safe_serialization=True)) and load that"
    )


def write_safetensors(tensors: dict[str, Tensor], path: Path) -> None:
    """Write ``tensors`` to ``path`` atomically (:func:`clearformer.io.atomic_write`)."""
    from safetensors.torch import save

    # Serialised in memory, then written through atomic_write, so a failed write leaves an
    # earlier file as it was. The bytes are about the size of the tensors, held once more.
    data = save({k: v.contiguous() for k, v in tensors.items()}, metadata={"format": "pt"})
    with atomic_write(path, "wb") as handle:
        handle.write(data)
