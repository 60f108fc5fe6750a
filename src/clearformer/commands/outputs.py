"""Checks on a command's outputs, made before the work and before anything is written.

* :func:`check_destination`: the file can be created where the user asked, tried for real
  (a temporary file made and removed), so a missing, read-only or full-permission-denied
  directory fails at once and the message names the user's path;
* :func:`check_finite`: embeddings hold no NaN or infinity, which JSON cannot express and no
  similarity survives; the message names the texts.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def check_destination(flag: str, path: str | os.PathLike) -> Path:
    """``path`` as a Path, after checking a file can be written there (CliError if not)."""
    from ..cli import CliError

    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    if target.is_dir():
        raise CliError(f"{flag}: {target} is a directory; give a file name")
    if not directory.is_dir():
        raise CliError(f"{flag}: cannot write {target}: directory {directory} does not exist")
    try:  # os.access says yes to root and knows nothing of read-only mounts: try it.
        fd, probe = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".probe", dir=directory)
    except OSError as exc:
        raise CliError(
            f"{flag}: cannot write {target}: directory {directory} is not writable ({exc.strerror})"
        ) from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)
    return target


def check_finite(embeddings, texts: list[str]) -> None:
    """Raise ValueError naming the texts whose embedding holds a NaN or an infinity."""
    from ..checks import check_finite_rows

    check_finite_rows(embeddings, texts)
