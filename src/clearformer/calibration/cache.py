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
does not parse (not UTF-8, not JSON, a field of the wrong type), or holds another key, is
ignored with a warning in the log and rebuilt by the next measurement. Verdicts that cannot be
written (a read-only folder, or no cache folder at all) are kept for the process that measured
them (:func:`keep_unsaved`).

A verdict measured while other processes were busy (context ``"loaded": true``) is
provisional: it is used, and the next process that may calibrate measures it again
(:func:`settled`). Measuring processes take turns on ``calibration/.lock`` (:func:`turn`).

A process reads each file once (:func:`cached_verdicts`); :func:`forget` drops what it read,
after a measurement writes a new file.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import threading
from collections.abc import Iterable, Iterator
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
    try:
        folder = cache_folder()
    except OSError:  # no cache folder: the file is outside it
        return path.name
    if os.environ.get(CACHE_VARIABLE):
        setting = f"${CACHE_VARIABLE}"
    # expanduser, unlike Path.home(), leaves "~" as it is where the home folder is unknown.
    elif folder.parent != Path(os.path.expanduser("~")) / ".cache":
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


# What cached_verdicts read: (key, cache folder settings) -> (verdicts or None, their file, or
# None where they are not in a file).
_read: dict[
    tuple[CalibrationKey, tuple[str, str, str]], tuple[dict[str, Verdict] | None, Path | None]
] = {}
# Verdicts measured in this process that the cache folder could not keep: this process uses
# them all the same (a read-only folder must not cost a measurement per decision).
_unsaved: dict[tuple[CalibrationKey, tuple[str, str, str]], dict[str, Verdict]] = {}
# The keys this process measured, or waited for another process to measure: their
# provisional verdicts are not measured again here.
_measured: set[tuple[CalibrationKey, tuple[str, str, str]]] = set()


def read(key: CalibrationKey) -> dict[str, Verdict] | None:
    """The verdicts kept for ``key`` (by choice name), None where there are none yet; a
    damaged file is logged and counts as none. Verdicts this process measured and could not
    write (:func:`keep_unsaved`) come first."""
    unsaved = _unsaved.get((key, _settings()))
    if unsaved is not None:
        return dict(unsaved)
    try:
        path = key.path()
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as error:  # unreadable, or no cache folder at all
        log.warning("calibration cache cannot be read (%s); ignored", error)
        return None
    try:
        data = json.loads(raw.decode("utf-8"))  # UnicodeDecodeError: a ValueError
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"expected format {FORMAT}, got {data.get('format')!r}")
        if data.get("key") != asdict(key):
            raise ValueError(f"it holds key {data.get('key')!r}, expected {asdict(key)!r}")
        verdicts = data.get("verdicts")
        if not isinstance(verdicts, dict):
            raise ValueError(f"field 'verdicts': expected an object, got {verdicts!r}")
        return {name: Verdict.from_dict(value) for name, value in verdicts.items()}
    except (ValueError, TypeError, AttributeError, RecursionError) as error:
        log.warning(
            "calibration cache %s is damaged (%s); ignored, and rebuilt by the next "
            "measurement (`clearformer calibrate`)",
            path,
            error,
        )
        return None


def write(key: CalibrationKey, verdicts: dict[str, Verdict]) -> Path:
    """Keep ``verdicts`` for ``key`` (replacing the file whole) and return its path. Raises
    OSError where the cache folder cannot hold it (the caller may :func:`keep_unsaved`)."""
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
    with _lock:
        _unsaved.pop((key, _settings()), None)  # the file holds them now
    settle(key)
    return path


def keep_unsaved(key: CalibrationKey, verdicts: dict[str, Verdict]) -> None:
    """Use ``verdicts`` for ``key`` in this process, where :func:`write` could not keep them."""
    with _lock:
        _unsaved[(key, _settings())] = dict(verdicts)
    settle(key)


def settle(key: CalibrationKey) -> None:
    """Count ``key``'s verdicts as measured at this start (this process measured them, or
    waited while another did): provisional ones are not measured again by this process."""
    with _lock:
        _measured.add((key, _settings()))
    forget()


def provisional(verdicts: dict[str, Verdict]) -> bool:
    """Whether any of ``verdicts`` was measured while other processes were busy (its context
    says ``"loaded": true``): it may not hold on a quiet machine."""
    return any(verdict.context.get("loaded") is True for verdict in verdicts.values())


def settled(
    key: CalibrationKey, verdicts: dict[str, Verdict] | None, choices: Iterable[str]
) -> bool:
    """Whether ``verdicts`` need no new measurement: one for each of ``choices``, and none
    provisional unless measured at this start (:func:`settle`: a busy machine is measured
    again by the next process, not again and again by this one)."""
    if verdicts is None or not set(choices) <= set(verdicts):
        return False
    return not provisional(verdicts) or (key, _settings()) in _measured


@contextlib.contextmanager
def held_lock(path: Path, *, wait: bool = True) -> Iterator[bool]:
    """Hold an exclusive ``flock`` on ``path`` (made if need be) for the block; the kernel
    frees it when its holder dies. Yields False where another process holds it and ``wait``
    is False; True without a lock where ``path`` cannot be made or locked (a read-only
    folder, where nothing can be written to race over, or a file system without locks)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "a")  # noqa: SIM115 (closed below, after the block)
    except OSError:
        handle = None
    held = True
    try:
        if handle is not None:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                held = False
            except OSError as error:
                log.debug("no lock on %s (%s); going on without one", path, error)
        yield held
    finally:
        if handle is not None:
            handle.close()  # releases the lock


@contextlib.contextmanager
def turn() -> Iterator[None]:
    """One measuring process at a time on this cache folder (``calibration/.lock``): two
    measuring side by side would load each other's timings, and the later one's file would
    replace the earlier one's."""
    try:
        lock = cache_folder() / "calibration" / ".lock"
    except OSError:  # no cache folder: nothing shared to take turns on
        lock = None
    with contextlib.nullcontext() if lock is None else held_lock(lock):
        yield


def cached_verdicts(key: CalibrationKey) -> tuple[dict[str, Verdict] | None, Path | None]:
    """:func:`read` and the file it read (None where the verdicts are not in a file: kept
    unsaved, or no cache folder), once per process, key and cache folder (routes ask on
    every call)."""
    memo = (key, _settings())
    with _lock:
        if memo not in _read:
            _read[memo] = (read(key), stored_path(key))
        return _read[memo]


def stored_path(key: CalibrationKey) -> Path | None:
    """The file ``key``'s verdicts are kept in; None where this process keeps them unsaved
    (:func:`keep_unsaved`) or there is no cache folder."""
    if (key, _settings()) in _unsaved:
        return None
    try:
        return key.path()
    except OSError:
        return None


def forget() -> None:
    """Drop what :func:`cached_verdicts` read (a new measurement was written, or a test
    changed the cache folder)."""
    with _lock:
        _read.clear()
