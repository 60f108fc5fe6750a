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

NAMED_TEXTS = 5  # texts listed by name in an error; the count says how many more


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
    import numpy as np

    bad = np.flatnonzero(~np.isfinite(embeddings).all(axis=1))
    if not len(bad):
        return
    named = ", ".join(f"{int(i)} ({_short(texts[int(i)])!r})" for i in bad[:NAMED_TEXTS])
    more = f" and {len(bad) - NAMED_TEXTS} more" if len(bad) > NAMED_TEXTS else ""
    raise ValueError(
        f"the embeddings of {len(bad)} of {len(texts)} texts are not finite (NaN or infinity; "
        f"the checkpoint's weights may be damaged): texts {named}{more}; nothing was written"
    )


def _short(text: str, width: int = 40) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."
