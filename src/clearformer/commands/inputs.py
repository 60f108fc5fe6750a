"""Input files named on the command line: one check, and one wording, for every command."""

from __future__ import annotations

import os
from pathlib import Path


def require_input_file(value: str | Path, flag: str) -> Path:
    """``value`` as a path to read, else a :class:`~clearformer.cli.CliError` that names
    ``flag`` and says what the path is instead (missing, or a directory).

    Any existing path that is not a directory is read: a regular file, and also a named pipe,
    ``/dev/stdin`` or a shell's process substitution (``-i <(head corpus.txt)``, a
    ``/dev/fd/N`` path), which are no regular files. A command reads it once."""
    from ..cli import CliError

    path = Path(value)
    if path.is_dir():
        raise CliError(f"{flag}: {path} is a directory, expected a file")
    if not path.exists():
        raise CliError(f"{flag} file not found: {path}")
    return path


JSONL_SUFFIXES = (".jsonl", ".ndjson")


def is_jsonl(path: Path) -> bool:
    """Whether ``path`` names JSON lines by its suffix, in any case (``docs.JSONL``,
    ``docs.ndjson``): read as plain lines, each line's JSON syntax would be embedded."""
    return path.suffix.lower() in JSONL_SUFFIXES


def same_file(a: Path, b: Path) -> bool:
    """One file under two names: the same resolved path, or a hard link to it (an output
    that names an input would replace what it is computed from)."""
    if a.resolve() == b.resolve():
        return True
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:  # unreadable here: the reads and writes that follow say why
        return False


def check_model_directory(value: str) -> None:
    """``--model`` names a directory, said with the flag: the loader's own message names
    neither."""
    from ..cli import CliError

    path = Path(value).expanduser()
    if not path.exists():
        raise CliError(f"--model: checkpoint directory not found: {value}")
    if not path.is_dir():
        raise CliError(f"--model: checkpoint path must be a directory, got a file: {value}")
