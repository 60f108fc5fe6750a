"""Reading text inputs and writing outputs atomically (used by the CLI commands).

An output file is written to a temporary file in the same directory and moved into place with
``os.replace``, so a reader never sees half a file and an earlier file is never lost to a
failed write.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from .checks import check_unicode

__all__ = ["atomic_write", "read_lines", "read_jsonl_field", "read_texts"]


def publish(tmp: str | os.PathLike, target: str | os.PathLike) -> None:
    """Give a finished temporary file the usual permissions and move it onto ``target``.

    ``mkstemp`` creates files readable by their owner only; a report or an embedding file
    should get the permissions any new file gets (0666 less the umask).
    """
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    os.replace(tmp, target)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w") -> Iterator[IO]:
    """Open a temporary file next to ``path``; on success move it onto ``path``.

    Args:
        path: the final file.
        mode: ``"w"`` (UTF-8 text) or ``"wb"``.

    On an exception the temporary file is removed and ``path`` is left as it was.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"mode must be 'w' or 'wb', got {mode!r}")
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise FileNotFoundError(f"output directory does not exist: {directory}")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        # mkstemp's message names the hidden temporary file, which the caller never gave.
        raise type(exc)(exc.errno, f"cannot write {target}: {exc.strerror}") from None
    try:
        encoding = "utf-8" if mode == "w" else None
        with os.fdopen(fd, mode, encoding=encoding) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        try:
            publish(tmp, target)
        except OSError as exc:
            raise type(exc)(exc.errno, f"cannot write {target}: {exc.strerror}") from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def fsync_directory(path: str | os.PathLike) -> None:
    """Make a rename inside ``path`` durable (its directory entry is data too)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_text_atomically(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` through :func:`atomic_write`: a reader (or a run
    stopped halfway) sees the old file or the new one, never half of one."""
    with atomic_write(path) as handle:
        handle.write(text)


def _decode(data: bytes, source: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ValueError(
            f"{source} is not valid UTF-8 text: byte 0x{data[exc.start]:02x} at offset "
            f"{exc.start} (line {line}); convert the file to UTF-8"
        ) from None


def read_lines(data: bytes, source: str) -> list[str]:
    """One text per line (``\\n`` or ``\\r\\n``); a final newline does not add an empty text."""
    text = _decode(data, source)
    if text.startswith("\ufeff"):
        text = text[1:]  # a UTF-8 byte-order mark is not part of the first text
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def parse_json_object(line: str, where: str) -> dict:
    """One line of a JSONL file as a dict; ValueError starting with ``where`` (the file and
    line) when it is not JSON or not an object."""
    try:
        item = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not valid JSON ({exc.msg})") from None
    if not isinstance(item, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(item).__name__}")
    return item


def read_jsonl_field(data: bytes, source: str, field: str) -> list[str]:
    """The string ``field`` of each JSON object, one object per non-blank line."""
    return [text for _, text in read_numbered_texts(data, source, field=field)]


def read_numbered_texts(
    data: bytes, source: str, *, field: str | None = None
) -> list[tuple[int, str]]:
    """:func:`read_texts` with each text's line number in the file (1-based): the lines of a
    JSONL file's blank lines are skipped, so its texts' places are not their line numbers."""
    if field is None:
        return list(enumerate(read_lines(data, source), start=1))
    texts = []
    for number, line in enumerate(read_lines(data, source), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{source} line {number} is not valid JSON: {exc.msg}") from None
        if not isinstance(item, dict) or field not in item:
            raise ValueError(
                f"{source} line {number}: expected a JSON object with a {field!r} field, "
                f"got {type(item).__name__}"
                + (f" with fields {sorted(item)[:5]}" if isinstance(item, dict) else "")
            )
        value = item[field]
        if not isinstance(value, str):
            raise ValueError(
                f"{source} line {number}: field {field!r} must be a string, "
                f"got {type(value).__name__}"
            )
        check_unicode(value, f"{source} line {number}: field {field!r}")
        texts.append((number, value))
    return texts


def read_texts(data: bytes, source: str, *, field: str | None = None) -> list[str]:
    """Texts from a file's bytes: JSONL when ``field`` is given, else one text per line."""
    if field is not None:
        return read_jsonl_field(data, source, field)
    return read_lines(data, source)
