"""Input files named on the command line: one check, and one wording, for every command."""

from __future__ import annotations

from pathlib import Path


def require_input_file(value: str | Path, flag: str) -> Path:
    """``value`` as a path to an existing regular file, else a :class:`~clearformer.cli.CliError`
    that names ``flag`` and says what the path is instead (missing, or a directory)."""
    from ..cli import CliError

    path = Path(value)
    if path.is_dir():
        raise CliError(f"{flag}: {path} is a directory, expected a file")
    if not path.is_file():
        raise CliError(f"{flag} file not found: {path}")
    return path
