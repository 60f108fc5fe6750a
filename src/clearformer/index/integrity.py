"""The checks an index's files pass when it is opened: each file against ``meta.json``.

A damaged file (truncated, overwritten, removed, or a whole file of the wrong size put in its
place) must give an error naming it, never a traceback from deep inside numpy, SQLite or
usearch, and never results that are silently wrong (a segment with fewer vectors than its
texts hides the texts past its end). Every check reads headers, not data, so opening an index
of any size stays cheap:

* ``meta.json``: valid JSON, every field of the expected type, segments whose rows add up to
  the index's rows and whose offsets follow one another;
* ``.npy`` arrays: the format's header (shape, dtype, C order) and a file size that holds
  exactly that many rows;
* ``texts.sqlite``: SQLite's header (its page count times its page size is the file's size) and
  the first and last row numbers (two B-tree lookups);
* the graph: usearch's header (vectors, width, scalar kind) and a memory map of the whole file;
* ``segment.json``: the rows and content hash that ``meta.json`` records for the segment.

What no header shows (bytes overwritten inside a file that keeps its size) is found when a
search reads them: a vector that is not a unit vector or a database page SQLite cannot read is
the same error naming the file.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np

from . import engine
from .layout import SEGMENT_NAME, IndexDamagedError, JSONFileError, read_json
from .options import IndexOptions

_SQLITE_MAGIC = b"SQLite format 3\0"
_SQLITE_HEADER = 100  # bytes


def read_meta(path: Path, generation: str, expected_format: int) -> dict[str, Any]:
    """``meta.json`` of ``generation``, checked field by field."""
    try:
        meta = read_json(path)
    except FileNotFoundError:
        current = path.parent.parent.parent / "CURRENT"
        raise IndexDamagedError(path, f"is missing ({current} names generation {generation})"
                                ) from None  # fmt: skip
    except JSONFileError as exc:
        raise IndexDamagedError(path, f"is not valid JSON ({exc.reason})") from None
    except OSError as exc:
        raise IndexDamagedError(path, f"cannot be read ({exc.strerror or exc})") from None
    if not isinstance(meta, dict):
        raise IndexDamagedError(path, f"holds a JSON {type(meta).__name__}, not an object")
    if meta.get("format") != expected_format:
        raise IndexDamagedError(
            path,
            f"has format {meta.get('format')!r}; this clearformer reads format {expected_format}",
        )
    _check_fields(path, meta, generation)
    return meta


def _check_fields(path: Path, meta: dict[str, Any], generation: str) -> None:
    def need(key: str, kind: type | tuple[type, ...], what: str) -> Any:
        value = meta.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise IndexDamagedError(path, f"has {key!r} {value!r:.60}, expected {what}")
        return value

    if meta.get("generation") != generation:
        raise IndexDamagedError(
            path, f"records generation {meta.get('generation')!r:.40}, but lies in {generation}"
        )
    model = need("model", dict, "an object")
    for key in ("revision", "pooling"):  # what a rerun compares to know it holds these texts
        if not isinstance(model.get(key), str):
            raise IndexDamagedError(
                path, f"has model {key!r} {model.get(key)!r:.40}, expected a str"
            )
    options = need("options", dict, "an object")
    try:
        IndexOptions.from_dict(options)
    except (TypeError, ValueError, KeyError) as exc:
        raise IndexDamagedError(path, f"has options that do not read ({exc})") from None
    dimensions = need("dimensions", int, "a positive integer")
    rows = need("rows", int, "an integer")
    if dimensions <= 0 or rows < 0:
        raise IndexDamagedError(
            path,
            f"records {rows} rows of {dimensions} dimensions, expected rows >= 0 and "
            "dimensions > 0",
        )
    if meta.get("ann") not in ("hnsw", "exact"):
        raise IndexDamagedError(path, f"has 'ann' {meta.get('ann')!r:.40}, expected hnsw or exact")
    ranges = meta.get("int8_ranges")
    if options.get("storage") == "int8":
        shape = np.shape(ranges) if isinstance(ranges, list) else None
        if shape != (2, dimensions):
            raise IndexDamagedError(
                path, f"has 'int8_ranges' of shape {shape}, expected (2, {dimensions})"
            )
    segments = need("segments", list, "a list")
    offset = 0
    for i, segment in enumerate(segments):
        where = f"segments[{i}]"
        if not isinstance(segment, dict):
            raise IndexDamagedError(path, f"has {where} that is not an object")
        name = segment.get("name")
        if not isinstance(name, str) or not SEGMENT_NAME.fullmatch(name):
            # Never a path: a name read from disk must not lead out of segments/.
            raise IndexDamagedError(
                path, f"names {where} {name!r:.40}, not a segment (seg-<16 hex digits>)"
            )
        if not isinstance(segment.get("content"), str):
            raise IndexDamagedError(path, f"gives {where} ({name}) no content hash")
        count = segment.get("rows")
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            raise IndexDamagedError(path, f"gives {where} ({name}) rows {count!r:.20}")
        if segment.get("offset") != offset:
            raise IndexDamagedError(
                path,
                f"starts {where} ({name}) at row {segment.get('offset')!r:.20}, but the "
                f"segments before it hold {offset} rows",
            )
        offset += count
    if offset != rows:
        raise IndexDamagedError(path, f"records {rows} rows, but its segments hold {offset}")


def check_array(path: Path, rows: int, width: int, dtype: str, meta: Path) -> None:
    """A ``.npy`` file holds a C-order (rows, width) array of ``dtype``, and exactly its bytes."""
    try:
        problem = array_problem(path, rows, width, dtype, meta)
    except FileNotFoundError:
        raise IndexDamagedError(path, f"is missing ({meta} names its segment)") from None
    if problem is not None:
        raise IndexDamagedError(path, problem)


def array_problem(path: Path, rows: int, width: int | None, dtype: str, meta: Path) -> str | None:
    """What is wrong with a ``.npy`` file that should hold a C-order (rows, width) array of
    ``dtype`` (any width for None) and exactly its bytes; None when nothing is.
    FileNotFoundError when it is missing."""
    try:
        with open(path, "rb") as handle:
            version = np.lib.format.read_magic(handle)
            readers = {
                (1, 0): np.lib.format.read_array_header_1_0,
                (2, 0): np.lib.format.read_array_header_2_0,
            }
            if version not in readers:
                raise ValueError(f"unknown .npy format version {version}")
            shape, fortran_order, found = readers[version](handle)
            header = handle.tell()
            size = os.fstat(handle.fileno()).st_size
    except FileNotFoundError:
        raise
    except (ValueError, OSError, SyntaxError, EOFError) as exc:
        return f"is not a .npy array ({_first_line(exc)})"
    if found != np.dtype(dtype) or fortran_order:
        order = "Fortran" if fortran_order else "C"
        return f"holds {found} in {order} order, expected {dtype} in C order"
    shape = tuple(shape)
    if len(shape) != 2 or shape[0] != rows or width is not None and shape[1] != width:
        wanted = f"({rows}, {width})" if width is not None else f"{rows} rows"
        return f"holds an array of shape {shape}, but {meta} records {wanted}"
    expected = header + rows * shape[1] * found.itemsize
    if size != expected:
        return (
            f"is {size:,} bytes, but its header's {shape} {dtype} array needs {expected:,} (the "
            "file was cut short or added to)"
        )
    return None


def open_array(path: Path, rows: int, width: int, dtype: str, meta: Path) -> np.ndarray:
    """The checked ``.npy`` file, memory-mapped."""
    check_array(path, rows, width, dtype, meta)
    return np.load(path, mmap_mode="r")


def check_texts(path: Path, rows: int, meta: Path) -> None:
    """``texts.sqlite`` is a whole SQLite file whose table holds rows 0 .. rows - 1."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(_SQLITE_HEADER)
            size = os.fstat(handle.fileno()).st_size
    except FileNotFoundError:
        raise IndexDamagedError(path, f"is missing ({meta} names its segment)") from None
    except OSError as exc:
        raise IndexDamagedError(path, f"cannot be read ({exc.strerror or exc})") from None
    if len(head) < _SQLITE_HEADER or not head.startswith(_SQLITE_MAGIC):
        raise IndexDamagedError(path, "is not an SQLite database (its header is missing)")
    page_size = int.from_bytes(head[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(head[28:32], "big")
    # The page count is valid when the "version valid for" number equals the change counter
    # (every SQLite since 3.7.0 keeps them so); else only whole pages can be checked.
    counted = head[92:96] == head[24:28] and pages > 0
    if page_size < 512 or (counted and size != pages * page_size) or size % page_size:
        expected = f"{pages * page_size:,}" if counted else f"a multiple of {page_size}"
        raise IndexDamagedError(
            path,
            f"is {size:,} bytes, but its header says {expected} (the file was cut short "
            "or added to)",
        )
    try:
        first, last = texts_row_range(path)
    except sqlite3.Error as exc:
        raise IndexDamagedError(path, f"cannot be read by SQLite ({_first_line(exc)})") from None
    if (first, last) != ((0, rows - 1) if rows else (None, None)):
        held = "no rows" if first is None else f"rows {first} to {last}"
        raise IndexDamagedError(path, f"holds {held}, but {meta} records {rows} rows")


def texts_row_range(path: Path) -> tuple[int | None, int | None]:
    """The first and last row numbers of a texts database (two B-tree lookups, no scan)."""
    connection = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro&immutable=1", uri=True)
    try:
        connection.execute("SELECT row, id, text FROM texts WHERE row = -1").fetchall()
        first = connection.execute("SELECT min(row) FROM texts").fetchone()[0]
        last = connection.execute("SELECT max(row) FROM texts").fetchone()[0]
    finally:
        connection.close()
    return first, last


def check_segment_record(path: Path, segment: dict[str, Any], meta: Path) -> None:
    """``segment.json`` records the rows and content that ``meta.json`` gives the segment."""
    try:
        record = read_json(path)
    except FileNotFoundError:
        raise IndexDamagedError(path, f"is missing ({meta} names its segment)") from None
    except JSONFileError as exc:
        raise IndexDamagedError(path, f"is not valid JSON ({exc.reason})") from None
    except OSError as exc:
        raise IndexDamagedError(path, f"cannot be read ({exc.strerror or exc})") from None
    if not isinstance(record, dict):
        raise IndexDamagedError(path, f"holds a JSON {type(record).__name__}, not an object")
    for key in ("rows", "name", "content"):
        if record.get(key) != segment.get(key):
            raise IndexDamagedError(
                path,
                f"records {key} {record.get(key)!r:.40}, but {meta} records "
                f"{segment.get(key)!r:.40}",
            )


def open_graph(path: Path, rows: int, dimensions: int, storage: str, meta: Path) -> Any:
    """The graph file, checked against the index's rows, width and storage, memory-mapped."""
    if not path.is_file():
        raise IndexDamagedError(path, f"is missing ({meta} records a graph index)")
    try:
        header = engine.graph_header(path)
    except (ValueError, RuntimeError, OSError) as exc:
        raise IndexDamagedError(path, f"is not a usearch graph ({_first_line(exc)})") from None
    scalar = engine.KINDS[storage][0]
    found = (header["count_present"], header["dimensions"], header["kind_scalar"].name.lower())
    if found != (rows, dimensions, scalar):
        raise IndexDamagedError(
            path,
            f"holds {found[0]} vectors of {found[1]} dimensions ({found[2]}), but {meta} "
            f"records {rows} of {dimensions} ({scalar})",
        )
    try:
        return engine.open_graph(path)
    except (ValueError, RuntimeError, OSError) as exc:
        raise IndexDamagedError(path, f"cannot be opened ({_first_line(exc)})") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def check_files(folder: Path, files: dict[str, Any], meta: Path) -> None:
    """Every file ``meta.json`` lists for a sparse, multi-vector or BM25 generation: a
    ``.npy`` array of exactly the recorded shape and dtype (header and size), any other file
    of exactly the recorded size and (small files: JSON written by an engine) SHA-256."""
    from .identity import file_sha256

    for name, expected in files.items():
        path = folder / name
        if not path.is_file():
            raise IndexDamagedError(path, f"is missing ({meta} names it)")
        if "shape" in expected:
            problem = shaped_array_problem(path, tuple(expected["shape"]), expected["dtype"], meta)
            if problem is not None:
                raise IndexDamagedError(path, problem)
            continue
        size = path.stat().st_size
        if size != expected["bytes"]:
            raise IndexDamagedError(
                path, f"is {size:,} bytes, but {meta} records {expected['bytes']:,}"
            )
        if "sha256" in expected and file_sha256(path) != expected["sha256"]:
            raise IndexDamagedError(path, f"does not hold the bytes {meta} records (SHA-256)")


def shaped_array_problem(path: Path, shape: tuple, dtype: str, meta: Path) -> str | None:
    """What is wrong with a ``.npy`` file that should hold a C-order array of exactly
    ``shape`` and ``dtype`` (any number of axes) and exactly its bytes; None when nothing is."""
    try:
        with open(path, "rb") as handle:
            version = np.lib.format.read_magic(handle)
            if version not in ((1, 0), (2, 0)):
                raise ValueError(f"unknown .npy format version {version}")
            read = np.lib.format.read_array_header_1_0
            if version == (2, 0):
                read = np.lib.format.read_array_header_2_0
            found_shape, fortran_order, found = read(handle)
            header = handle.tell()
            size = os.fstat(handle.fileno()).st_size
    except (ValueError, OSError, SyntaxError, EOFError) as exc:
        return f"is not a .npy array ({_first_line(exc)})"
    if found != np.dtype(dtype) or fortran_order:
        return f"holds {found}, expected {dtype} in C order"
    if tuple(found_shape) != tuple(shape):
        return f"holds an array of shape {tuple(found_shape)}, but {meta} records {tuple(shape)}"
    expected = header + int(np.prod(shape, dtype=np.int64)) * found.itemsize
    if size != expected:
        return (
            f"is {size:,} bytes, but its header's {tuple(shape)} {dtype} array needs "
            f"{expected:,} (the file was cut short or added to)"
        )
    return None


def file_record(path: Path) -> dict[str, Any]:
    """What :func:`check_files` holds ``path`` to: its shape and dtype, or size and hash."""
    from .identity import file_sha256

    if path.suffix == ".npy":
        array = np.load(path, mmap_mode="r")
        return {"shape": list(array.shape), "dtype": str(array.dtype)}
    if path.suffix in (".usearch", ".seismic"):  # large: its size here; its engine reads it
        return {"bytes": path.stat().st_size}
    return {"bytes": path.stat().st_size, "sha256": file_sha256(path)}
