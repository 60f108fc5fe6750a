"""A safetensors file read one tensor at a time, with plain reads rather than a memory map.

``safetensors.torch.load_file`` returns every tensor at once, so a load that also holds the
model peaks at twice the weights. Here the header is parsed and checked up front (names,
dtypes, shapes, byte ranges) and each tensor's bytes are read only when asked for, straight
into the caller's buffer where it can take them. Plain reads, not ``mmap``: the pages of a
mapped file that a copy touches count in the process's resident set until it is unmapped, which
is the very cost this avoids.

The format: an 8-byte little-endian header length N, N bytes of JSON mapping each name to
``{"dtype", "shape", "data_offsets": [begin, end]}`` (and an optional ``__metadata__``), then
the data, every tensor little-endian and C-ordered, its offsets relative to the data's start.
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch
from torch import Tensor

from .files import CheckpointError

# safetensors' own bound: a longer header means a damaged length field, not a real header,
# and reading it would allocate whatever the damaged field says.
_HEADER_LIMIT = 100_000_000

# Each safetensors dtype torch has (the float8 ones and unsigned integers from torch 2.1 / 2.3).
_DTYPES: dict[str, torch.dtype] = {
    code: dtype
    for code, dtype in {
        "BOOL": torch.bool,
        "U8": torch.uint8,
        "I8": torch.int8,
        "I16": torch.int16,
        "I32": torch.int32,
        "I64": torch.int64,
        "F16": torch.float16,
        "BF16": torch.bfloat16,
        "F32": torch.float32,
        "F64": torch.float64,
        "C64": torch.complex64,
        "U16": getattr(torch, "uint16", None),
        "U32": getattr(torch, "uint32", None),
        "U64": getattr(torch, "uint64", None),
        "F8_E4M3": getattr(torch, "float8_e4m3fn", None),
        "F8_E4M3FNUZ": getattr(torch, "float8_e4m3fnuz", None),
        "F8_E5M2": getattr(torch, "float8_e5m2", None),
        "F8_E5M2FNUZ": getattr(torch, "float8_e5m2fnuz", None),
        "F8_E8M0": getattr(torch, "float8_e8m0fnu", None),
    }.items()
    if dtype is not None
}


def damaged(path: Path, reason: str) -> CheckpointError:
    """The error for a safetensors file that cannot be read, in the words every reader uses."""
    return CheckpointError(f"cannot read {path}: {reason} (the file is corrupt or truncated)")


@dataclass(frozen=True)
class StoredTensor:
    """Where one tensor lies in a safetensors file: enough to check its shape without reading
    it, and to read all of it or a block of its rows."""

    path: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int  # the first byte of its data, from the start of the file
    end: int

    def read(self, rows: tuple[int, int] | None = None) -> Tensor:
        """The tensor (or rows ``[first, stop)`` of its first axis) in a new CPU tensor."""
        shape = self.shape if rows is None else (rows[1] - rows[0], *self.shape[1:])
        out = torch.empty(shape, dtype=self.dtype)
        self.read_into(out, rows)
        return out

    def read_into(self, destination: Tensor, rows: tuple[int, int] | None = None) -> None:
        """Read the tensor (or rows ``[first, stop)``) into ``destination``: a contiguous CPU
        tensor of this dtype with as many elements, a model's parameter say, so that no buffer
        of the tensor's size is allocated on the way."""
        start, end = self._byte_range(rows)
        if destination.dtype != self.dtype or not destination.is_contiguous():
            raise ValueError(f"read_into needs a contiguous {self.dtype} tensor")
        target = _byte_view(destination)
        if len(target) != end - start:
            raise ValueError(f"read_into needs {end - start} bytes, got {len(target)}")
        _read_exactly(self.path, start, target)
        if sys.byteorder == "big":
            _swap_byte_order(destination)

    def _byte_range(self, rows: tuple[int, int] | None) -> tuple[int, int]:
        if rows is None:
            return self.start, self.end
        first, stop = rows
        if not self.shape or not 0 <= first <= stop <= self.shape[0]:
            raise ValueError(f"rows {rows} outside a tensor of shape {self.shape}")
        row_bytes = math.prod(self.shape[1:]) * self.dtype.itemsize
        return self.start + first * row_bytes, self.start + stop * row_bytes


def read_header(path: Path) -> dict[str, StoredTensor]:
    """Every tensor of the safetensors file at ``path``, by name, from its header alone.

    Raises:
        CheckpointError: the file cannot be opened, or its header is not one the format allows
            (a bad length, bad JSON, an unknown dtype, offsets outside the file or that do not
            tile its data): the same checks ``safetensors`` makes, so that a file it refuses is
            refused here before any tensor is read.
    """
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            header, data_start = _parse_header(path, handle, size)
    except OSError as exc:
        raise damaged(path, exc.strerror or str(exc)) from None
    entries = {
        name: _stored_tensor(path, name, spec, data_start)
        for name, spec in header.items()
        if name != "__metadata__"
    }
    _check_tiling(path, entries, data_start, size - data_start)
    return entries


def _parse_header(path: Path, handle: BinaryIO, size: int) -> tuple[dict[str, Any], int]:
    """The JSON header as a dict, and where the data after it starts."""
    prefix = handle.read(8)
    if len(prefix) < 8:
        raise damaged(path, f"it has {size} bytes, fewer than the 8 of its header length")
    length = int.from_bytes(prefix, "little")
    if length > _HEADER_LIMIT:
        raise damaged(path, f"its header length {length} is over the format's limit")
    if 8 + length > size:
        raise damaged(path, f"its header length {length} runs past the end of its {size} bytes")
    try:
        header = json.loads(handle.read(length).decode("utf-8"))  # UTF-8 only, as the format
    except (UnicodeDecodeError, ValueError) as exc:
        raise damaged(path, f"its header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise damaged(path, "its header is not a JSON object")
    return header, 8 + length


def _stored_tensor(path: Path, name: str, spec: Any, data_start: int) -> StoredTensor:
    """One header entry, checked: a known dtype, a shape, and a byte range of that size."""
    if not isinstance(spec, dict):
        raise damaged(path, f"its header entry {name!r} is not an object")
    code = spec.get("dtype")
    dtype = _DTYPES.get(code) if isinstance(code, str) else None
    if dtype is None:
        raise damaged(path, f"tensor {name!r} has dtype {code!r}, not one torch reads")
    shape, offsets = spec.get("shape"), spec.get("data_offsets")
    if not _is_count_list(shape):
        raise damaged(path, f"tensor {name!r} has shape {shape!r}, not a list of sizes")
    if not _is_count_list(offsets) or len(offsets) != 2 or offsets[0] > offsets[1]:
        raise damaged(path, f"tensor {name!r} has data_offsets {offsets!r}, not [begin, end]")
    begin, end = offsets
    expected = math.prod(shape) * dtype.itemsize
    if end - begin != expected:
        raise damaged(
            path,
            f"tensor {name!r} has {end - begin} bytes of data, but {expected} for its "
            f"shape {tuple(shape)} of {dtype}",
        )
    return StoredTensor(path, dtype, tuple(shape), data_start + begin, data_start + end)


def _is_count_list(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in value
    )


def _check_tiling(
    path: Path, entries: dict[str, StoredTensor], data_start: int, data_size: int
) -> None:
    """The tensors' byte ranges cover the data exactly, in order, as ``safetensors`` requires:
    a range past the end is a truncated file, a gap or an overlap a damaged header, and bytes
    no tensor owns a file that is not what its header says."""
    reached = 0
    for name, entry in sorted(entries.items(), key=lambda item: (item[1].start, item[1].end)):
        begin, end = entry.start - data_start, entry.end - data_start
        if end > data_size:
            raise damaged(
                path,
                f"tensor {name!r} has data_offsets [{begin}, {end}], past the end of the "
                f"{data_size} bytes of data",
            )
        if begin != reached:
            raise damaged(path, f"tensor {name!r} starts at data byte {begin}, expected {reached}")
        reached = end
    if reached != data_size:
        raise damaged(path, f"its tensors take {reached} bytes of data, but it holds {data_size}")


def _byte_view(tensor: Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, writable in place (any dtype, 0-d and empty too)."""
    flat = tensor.detach().view(-1)  # a view, never a copy: the bytes must land in ``tensor``
    return memoryview(flat.view(torch.uint8).numpy())


def _read_exactly(path: Path, offset: int, target: memoryview) -> None:
    """Fill ``target`` with the file's bytes from ``offset``; a read may return fewer bytes
    than asked (and large ones do), so read until it is full or the file ends."""
    try:
        with open(path, "rb", buffering=0) as handle:
            handle.seek(offset)
            done = 0
            while done < len(target):
                got = handle.readinto(target[done:])
                if not got:
                    raise damaged(path, f"it ends at byte {offset + done}, inside a tensor's data")
                done += got
    except OSError as exc:
        raise damaged(path, exc.strerror or str(exc)) from None


def _swap_byte_order(tensor: Tensor) -> None:
    """Turn little-endian elements read on a big-endian machine into native ones, in place.
    A complex number is two floats, each swapped on its own."""
    unit = tensor.dtype.itemsize // (2 if tensor.dtype.is_complex else 1)
    if unit == 1:
        return
    grouped = tensor.detach().view(-1).view(torch.uint8).view(-1, unit)
    grouped.copy_(grouped.flip(1))
