"""Where an export goes, checked before any work: a new, empty or replaceable directory whose
parent exists, and never the checkpoint it exports (nor a folder holding it): an export
replaces its directory, and copies the checkpoint's configs but not its weights."""

from __future__ import annotations

from pathlib import Path


def check_target(target: Path, overwrite: bool) -> Path:
    """The export directory, checked: its parent exists, and it is new, empty or may be
    replaced."""
    target = target.expanduser()
    if target.exists() and not target.is_dir():
        raise FileExistsError(f"{target} exists and is not a directory")
    if target.is_dir() and any(target.iterdir()) and not overwrite:
        raise FileExistsError(
            f"{target} exists and is not empty; choose a new directory or overwrite it"
        )
    if not target.parent.is_dir():
        raise FileNotFoundError(f"cannot write {target}: directory {target.parent} does not exist")
    return target.absolute()


def check_apart(target: Path, checkpoint: Path, *, flag: str, named: str) -> None:
    """ValueError if ``target`` (given as ``flag``) is the ``checkpoint`` directory (``named``
    in the message) or holds it."""
    where, source = Path(target).resolve(), Path(checkpoint).resolve()
    if where == source or where in source.parents:
        raise ValueError(
            f"{flag} {target} holds the checkpoint it exports ({named}), which the export "
            "would replace; give another directory"
        )
