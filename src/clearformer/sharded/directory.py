"""A sharded run's output directory: the names of what a run writes there (shards, their
records, the manifest, the chunks of a run in progress, and io.atomic_write's temporary files
of them), reading its JSON objects, and removing what an earlier run of the same job left.

The directory may be one the user keeps other files in: only a file under one of these names,
named by a record of this job, is ever removed (:func:`remove_leftovers`).
"""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path
from typing import Any

from ..index.layout import read_json

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
CHUNKS = ".chunks"
JSON_TYPES = {list: "array", str: "string", int: "number", float: "number", bool: "boolean"}
# The names a run writes: shards, their records, and io.atomic_write's temporary files of
# them and of the manifest. A leftover is removed only under one of these names.
SHARD_FILE = re.compile(r"shard-\d{5}-of-\d{5}\.(npy|parquet)")
RECORD_FILE = re.compile(r"shard-\d{5}-of-\d{5}\.json")
TEMPORARY_FILE = re.compile(
    rf"\.(shard-\d{{5}}-of-\d{{5}}\.(npy|parquet|json)|{re.escape(MANIFEST)})\.\w+\.tmp"
)


def read_object(path: Path, what: str) -> dict[str, Any]:
    """The JSON object in ``path`` (a record or the manifest); ValueError naming the file if
    it holds other JSON (a list, a number): only a damaged or foreign file does."""
    data = read_json(path)
    if not isinstance(data, dict):
        held = JSON_TYPES.get(type(data), type(data).__name__)
        raise ValueError(
            f"{path} holds a JSON {held}, not the object a {what} is: remove it and run again"
        )
    return data


def record_path(out: Path, rank: int, world: int) -> Path:
    return out / f"shard-{rank:05d}-of-{world:05d}.json"


def remove_leftovers(out: Path, manifest: dict[str, Any]) -> list[str]:
    """Remove what the manifest's run no longer needs: the chunks, shards of an earlier,
    killed run of this job with another world size, and temporary files of killed shard,
    record and manifest writes; the names of what was removed, each logged. The writer of the
    manifest calls it, and so does every later run that finds the manifest complete (the
    writer may have been killed before it).

    ``out`` may be a directory the user keeps other files in: a file goes only when its name
    is a shard's and its record says it is this job's, and the chunks only when their
    ``job.json`` is this job's; anything else is left as it is (and logged when it looks like
    a shard)."""
    world = manifest["world"]
    kept = {s["file"] for s in manifest["shards"]} | {
        record_path(out, r, world).name for r in range(world)
    }
    doomed = [p for p in _earlier_shards(out, manifest["job"]) if p.name not in kept]
    # The temporary files (io.atomic_write's ".NAME.*.tmp") of a shard, a record or the
    # manifest, left by a process killed while writing it: every shard is written now, so
    # none is being written. Another rank may be writing this same manifest at this moment:
    # it finds its temporary file gone and this manifest in place (_write_manifest).
    doomed += [p for p in sorted(out.iterdir()) if TEMPORARY_FILE.fullmatch(p.name)]
    removed = []
    for path in doomed:
        path.unlink(missing_ok=True)
        removed.append(path.name)
    if _chunks_of(out, manifest["job"]):
        shutil.rmtree(out / CHUNKS, ignore_errors=True)
        removed.append(CHUNKS)
    for name in removed:
        log.info("%s: removed %s, left by an earlier run of this job", out, name)
    return removed


def _earlier_shards(out: Path, job: dict[str, Any]) -> list[Path]:
    """The shard files and records in ``out`` that a record of this job names (this run's and
    an earlier run's of another world size alike). A file with a shard's name but no record
    of this job (a user's, another job's, or a shard whose rank was killed before recording
    it) is not one: nothing says it may go."""
    found = set()
    for path in sorted(out.glob("shard-*.json")):
        if not RECORD_FILE.fullmatch(path.name):
            continue  # not a record's name: a user's file, left alone
        try:
            record = read_object(path, "shard record")
        except ValueError:  # damaged or foreign JSON: not known to be this job's
            log.info("%s: left as it is (not a record of this job)", path)
            continue
        if record.get("job") != job:
            log.info("%s: left as it is (a record of another job)", path)
            continue
        found.add(path.name)
        named = record.get("file")
        if isinstance(named, str) and SHARD_FILE.fullmatch(named) and (out / named).is_file():
            found.add(named)
    for path in sorted(out.glob("shard-*")):
        if path.name not in found:
            log.info("%s: left as it is (no record of this job names it)", path)
    return [out / name for name in sorted(found)]


def _chunks_of(out: Path, job: dict[str, Any]) -> bool:
    """Whether ``out/.chunks`` is there and its ``job.json`` is this job's (an empty folder,
    left by a kill before its record was written, is too); a folder holding anything else is
    not removed."""
    chunks = out / CHUNKS
    if not chunks.is_dir():
        return False
    record = chunks / "job.json"
    if not record.is_file():
        if any(chunks.iterdir()):
            log.info("%s: left as it is (no job.json says it holds this job's chunks)", chunks)
            return False
        return True
    try:
        found = read_json(record)
    except ValueError:  # damaged: not known to be this job's
        found = None
    if found != job:
        log.info("%s: left as it is (its job.json is not this job's)", chunks)
        return False
    return True
