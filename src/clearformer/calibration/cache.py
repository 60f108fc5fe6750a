"""Where measured verdicts are kept: one JSON file per CPU model, software and kernel build.

A verdict holds for the CPU that measured it and the code that ran, so its file is named by
a :class:`CalibrationKey`: the CPU model (and family numbers, which tell generations apart
where a virtual machine hides the full name), the PyTorch and clearformer versions, and the
build of clearformer's kernels. Change any of them and the old file no longer applies; a new
measurement writes a new file.

Files live in clearformer's cache folder (:func:`clearformer.machine.cache_folder`:
``$CLEARFORMER_CACHE``, else ``$XDG_CACHE_HOME/clearformer``, else ``~/.cache/clearformer``),
under ``calibration/``; each is written whole to a temporary
file and moved into place (``os.replace``), so a reader never sees half of one. A file that
does not parse, or holds another key, is ignored with a warning in the log and rebuilt by the
next measurement.

A process reads each file once (:func:`cached_verdicts`); :func:`forget` drops what it read,
after a measurement writes a new file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from ..io import atomic_write
from ..machine import CACHE_VARIABLE, cache_folder
from .measure import Verdict

log = logging.getLogger(__name__)

FORMAT = 1  # the file's layout; a file of another format is ignored and rebuilt

_lock = threading.Lock()


def shown(path: Path) -> str:
    """``path`` as a reason, a log line or a report names it: a file in the cache folder
    spelled from the setting that chose the folder (``$CLEARFORMER_CACHE/...``,
    ``$XDG_CACHE_HOME/clearformer/...``, ``~/.cache/clearformer/...``), so that a plan or an
    explain report sent to someone else names no folder of this machine; the file name alone
    for a file outside it. (Every plan's reasons name it: kept per path and settings.)"""
    memo = (str(path), _settings())
    spelled = _shown.get(memo)
    if spelled is None:
        spelled = _shown[memo] = _spelled(Path(path))
    return spelled


def _spelled(path: Path) -> str:
    folder = cache_folder()
    if os.environ.get(CACHE_VARIABLE):
        setting = f"${CACHE_VARIABLE}"
    elif folder.parent != Path.home() / ".cache":
        setting = "$XDG_CACHE_HOME/clearformer"
    else:
        setting = "~/.cache/clearformer"
    try:
        inside = path.relative_to(folder)
    except ValueError:
        return path.name
    return f"{setting}/{inside.as_posix()}"


def _settings() -> tuple[str, str, str]:
    """The environment that chooses the cache folder, as a cheap key for what was read."""
    environ = os.environ
    return (
        environ.get(CACHE_VARIABLE, ""),
        environ.get("XDG_CACHE_HOME", ""),
        environ.get("HOME", ""),
    )


_shown: dict[tuple[str, tuple[str, str, str]], str] = {}


@dataclass(frozen=True)
class CalibrationKey:
    """What a verdict depends on."""

    cpu: str  # clearformer.cpu.CpuInfo.model, with the family numbers
    torch: str
    clearformer: str
    build: str  # the kernels' build (their library's hash); "" where nothing is built

    def path(self) -> Path:
        """The file this key's verdicts live in."""
        digest = hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()
        return cache_folder() / "calibration" / f"verdicts-{digest[:16]}.json"

    def describe(self) -> str:
        build = f", kernels {self.build}" if self.build else ""
        return f"{self.cpu}, torch {self.torch}, clearformer {self.clearformer}{build}"


# What cached_verdicts read: (key, cache folder settings) -> (verdicts or None, their file).
_read: dict[
    tuple[CalibrationKey, tuple[str, str, str]], tuple[dict[str, Verdict] | None, Path]
] = {}


def read(key: CalibrationKey) -> dict[str, Verdict] | None:
    """The verdicts kept for ``key`` (by choice name), None where there are none yet; a
    damaged file is logged and counts as none."""
    path = key.path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as error:
        log.warning("calibration cache %s cannot be read (%s); ignored", path, error)
        return None
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"expected format {FORMAT}, got {data.get('format')!r}")
        if data.get("key") != asdict(key):
            raise ValueError(f"it holds key {data.get('key')!r}, expected {asdict(key)!r}")
        verdicts = data.get("verdicts")
        if not isinstance(verdicts, dict):
            raise ValueError(f"field 'verdicts': expected an object, got {verdicts!r}")
        return {name: Verdict.from_dict(value) for name, value in verdicts.items()}
    except (ValueError, TypeError, AttributeError) as error:
        log.warning(
            "calibration cache %s is damaged (%s); ignored, and rebuilt by the next "
            "measurement (`clearformer calibrate`)",
            path,
            error,
        )
        return None


def write(key: CalibrationKey, verdicts: dict[str, Verdict]) -> Path:
    """Keep ``verdicts`` for ``key`` (replacing the file whole) and return its path."""
    path = key.path()
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "format": FORMAT,
        "key": asdict(key),
        "verdicts": {name: verdict.to_dict() for name, verdict in verdicts.items()},
    }
    with atomic_write(path) as handle:
        json.dump(data, handle, indent=2, sort_keys=True)
        handle.write("\n")
    log.info("calibration verdicts written to %s", path)
    forget()
    return path


def cached_verdicts(key: CalibrationKey) -> tuple[dict[str, Verdict] | None, Path]:
    """:func:`read` and the file it read, once per process, key and cache folder (routes ask
    on every call)."""
    memo = (key, _settings())
    with _lock:
        if memo not in _read:
            _read[memo] = (read(key), key.path())
        return _read[memo]


def forget() -> None:
    """Drop what :func:`cached_verdicts` read (a new measurement was written, or a test
    changed the cache folder)."""
    with _lock:
        _read.clear()
