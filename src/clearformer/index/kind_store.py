"""Generations of a sparse, multi-vector or BM25 sub-index: the dense index's commit protocol
(:mod:`.layout`) around an engine's files.

A write: check the texts against the collection's store (:mod:`.collection`), encode the
texts in chunks committed one by one (:class:`~.ragged.RaggedChunkStore`; a killed build
resumes from them), let the kind write its engine files into a new generation directory
(filled under a temporary name, then renamed), record every file's shape or hash in its
``meta.json``, and replace ``CURRENT``. A read checks each recorded file before any engine
opens it, so damage is an :class:`~.layout.IndexDamagedError` naming the file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import integrity, layout
from .chunks import ChunkDone, chunk_count, chunk_progress, embed_chunks
from .collection import KIND_FORMAT, ensure_texts, kind_generation
from .ragged import Ragged, RaggedChunkStore, concatenate

log = logging.getLogger(__name__)

_OPEN_TRIES = 5

# (folder to fill, the encoded rows or None) -> None: the kind's engine files
WriteFiles = Callable[[Path, Ragged | None], None]
# (texts, row of the first, progress) -> the texts' rows
EncodeChunk = Callable[[list[str], Any], Ragged]


def write_kind(
    root: Path,
    kind: str,
    texts: list[str],
    ids: list[str],
    *,
    model: dict[str, Any] | None,
    options: dict[str, Any],
    write_files: WriteFiles,
    encode: EncodeChunk | None,
    chunk_rows: int,
    reader: Callable[[Path], Any] | None = None,
    on_chunk: ChunkDone | None = None,
    precision: str = "float32",
    progress: Any = None,
) -> str:
    """Build the ``kind`` sub-index of the collection ``root``; the committed generation.

    ``reader`` opens the committed sub-index as a search would (default: its files checked
    against ``meta.json``): a build of what is already committed does nothing unless that
    fails, and then writes it again (how damage is repaired). ``precision``: what the model
    computes in (:func:`model_precision`); a build in another precision is another build."""
    content = ensure_texts(root, texts, ids)
    sub = root / kind
    # float32 builds are recorded (and keyed) as they were before precisions were recorded.
    other = {} if precision == "float32" else {"precision": precision}
    job = {
        "kind": kind,
        "texts": content,
        "rows": len(texts),
        "model": None if model is None else model["revision"],
        "options": options,
        "chunk_rows": chunk_rows,
        **other,
    }
    job_key = _job_key(job)
    with layout.writer_lock(sub):
        current = _current_meta(sub)
        if current is not None and _same_build(current[1], job, model):
            try:
                (reader or (lambda where: open_kind(where, kind)))(root)
                log.info(
                    "%s already holds this %s index (%s): nothing to do", sub, kind, current[0]
                )
                layout.remove_stale(sub)
                shutil.rmtree(sub / "staging" / job_key, ignore_errors=True)
                return current[0]
            except layout.IndexDamagedError as exc:
                log.warning("%s; writing the %s index again", exc, kind)
        rows = None
        if encode is not None:
            rows = encode_in_chunks(
                sub / "staging" / job_key, job, texts, encode, chunk_rows, on_chunk, progress
            )
        meta = {
            "kind": kind,
            "model": model,
            "options": options,
            "rows": len(texts),
            "texts": content,
            **other,
        }
        previous = None if current is None else current[0]
        name = write_generation(sub, meta, lambda folder: write_files(folder, rows), previous)
        finish(sub, name, job_key)
    return name


def encode_in_chunks(
    staging: Path,
    job: dict[str, Any],
    texts: list[str],
    encode: EncodeChunk,
    chunk_rows: int,
    on_chunk: ChunkDone | None = None,
    progress: Any = None,
) -> Ragged:
    """``texts`` encoded in chunks, each committed to ``staging`` (the job's chunk directory)
    once: a killed run resumes from them. The rows, concatenated."""
    started = time.perf_counter()
    store = RaggedChunkStore(staging, job)
    log.info(
        "encoding %s texts in %d chunk(s) of up to %s",
        f"{len(texts):,}",
        chunk_count(len(texts), chunk_rows),
        f"{chunk_rows:,}",
    )

    encoded, reused = embed_chunks(
        lambda chunk, start: encode(chunk, chunk_progress(progress, start, len(texts))),
        texts,
        store,
        chunk_rows,
        on_chunk=on_chunk,
    )
    log.info(
        "encoded %s texts (%d chunk(s) encoded, %d reused) in %.1fs",
        f"{len(texts):,}",
        encoded,
        reused,
        time.perf_counter() - started,
    )
    return concatenate([store.read(i) for i in range(encoded + reused)])


def write_generation(
    sub: Path, meta: dict[str, Any], fill: Callable[[Path], None], previous: str | None
) -> str:
    """A new generation of ``sub`` after the committed ``previous``: ``fill`` writes the
    engine's files into a directory under a temporary name, ``meta.json`` records them (with
    ``meta``: kind, model, options, rows, texts) and the directory is renamed into place. Its
    name; not current until :func:`finish`. The caller holds ``sub``'s writer lock."""
    name = layout.next_generation_name(sub)
    started = time.perf_counter()
    with layout.new_directory(layout.generation_dir(sub, name)) as folder:
        fill(folder)
        files = {p.name: integrity.file_record(p) for p in sorted(folder.iterdir())}
        record = {
            "format": KIND_FORMAT,
            "generation": name,
            "previous": previous,
            **meta,
            "files": files,
            "segments": [],  # layout.remove_stale reads it: no dense segments here
        }
        layout.write_json(folder / layout.META, record)
    log.info("wrote the %s index in %.1fs", meta["kind"], time.perf_counter() - started)
    return name


def finish(sub: Path, name: str, job_key: str | None) -> None:
    """Make generation ``name`` of ``sub`` current (the commit), then remove what no kept
    generation uses and the job's chunks."""
    layout.commit(sub, name)
    log.info("committed %s of %s", name, sub)
    layout.remove_stale(sub)
    layout.clear_staging(sub, job_key)


def _job_key(job: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(job, sort_keys=True).encode()).hexdigest()[:16]


def _same_build(meta: dict[str, Any], job: dict[str, Any], model: dict | None) -> bool:
    revision = None if meta.get("model") is None else meta["model"].get("revision")
    return (
        meta.get("texts") == job["texts"]
        and meta.get("options") == job["options"]
        and revision == job["model"]
        and (model is None) == (meta.get("model") is None)
        and meta.get("precision", "float32") == job.get("precision", "float32")
    )


def model_precision(model: Any) -> str:
    """The precision a sparse or multi-vector model (or a bge-m3 view of one) was loaded in
    and computes in by default: its ``precision``, float32 where it holds none."""
    held = getattr(model, "precision", None)
    if not isinstance(held, str):
        held = getattr(getattr(model, "model", None), "precision", None)
    return held if isinstance(held, str) else "float32"


def _current_meta(sub: Path) -> tuple[str, dict[str, Any]] | None:
    """The committed generation and its meta, or None (none, or damaged: a build replaces
    it whatever it holds)."""
    try:
        name = layout.current_generation(sub)
        if name is None:
            return None
        return name, read_kind_meta(sub, name)
    except layout.IndexDamagedError as exc:
        log.warning("%s; the build writes the index anew", exc)
        return None


def read_kind_meta(sub: Path, generation: str) -> dict[str, Any]:
    """``meta.json`` of a sparse / multi-vector / BM25 generation, checked field by field."""
    path = layout.generation_dir(sub, generation) / layout.META
    try:
        meta = layout.read_json(path)
    except FileNotFoundError:
        raise layout.IndexDamagedError(
            path, f"is missing ({sub / layout.CURRENT} names generation {generation})"
        ) from None
    except (layout.JSONFileError, OSError) as exc:
        raise layout.IndexDamagedError(path, f"cannot be read ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != KIND_FORMAT:
        raise layout.IndexDamagedError(path, f"is not a format-{KIND_FORMAT} meta.json object")
    fields = {"generation": str, "kind": str, "options": dict, "rows": int, "files": dict}
    for key, kind in fields.items():
        if not isinstance(meta.get(key), kind):
            raise layout.IndexDamagedError(path, f"has {key!r} {meta.get(key)!r:.60}")
    if meta["generation"] != generation:
        raise layout.IndexDamagedError(path, f"records generation {meta['generation']!r:.40}")
    # bm25 records "model": null; the other kinds their model's identity. Absent, it is lost.
    if "model" not in meta:
        raise layout.IndexDamagedError(path, "has no 'model' (the model's identity, or null)")
    if meta["model"] is not None and not isinstance(meta["model"], dict):
        raise layout.IndexDamagedError(path, f"has 'model' {meta['model']!r:.60}")
    for name, record in meta["files"].items():
        if "/" in name or name.startswith(".") or not isinstance(record, dict):
            raise layout.IndexDamagedError(path, f"lists a file {name!r:.60} it cannot hold")
        if not _file_record_is_whole(record):
            raise layout.IndexDamagedError(
                path,
                f"records file {name!r:.60} as {record!r:.80}, not an array's shape and dtype "
                "or a file's bytes (and SHA-256)",
            )
    return meta


def _file_record_is_whole(record: dict[str, Any]) -> bool:
    """A listed file's record: ``{"shape": [ints >= 0], "dtype": str}`` for an array, else
    ``{"bytes": int >= 0}`` with an optional 64-hex ``"sha256"``."""

    def count(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    if "shape" in record:
        shape = record["shape"]
        return (
            isinstance(shape, list)
            and all(count(n) for n in shape)
            and isinstance(record.get("dtype"), str)
        )
    digest = record.get("sha256")
    hex_digest = isinstance(digest, str) and len(digest) == 64
    hex_digest = hex_digest and all(c in "0123456789abcdef" for c in digest)
    return count(record.get("bytes")) and (digest is None or hex_digest)


def open_kind(root: Path, kind: str) -> tuple[Path, dict[str, Any]]:
    """The committed generation of ``root``'s ``kind`` sub-index: its folder and checked meta,
    every recorded file checked (IndexDamagedError naming the file)."""
    sub = root / kind
    for attempt in range(_OPEN_TRIES):
        generation = kind_generation(sub)
        if generation is None:
            raise FileNotFoundError(f"{sub} holds no committed {kind} index")
        folder = layout.generation_dir(sub, generation)
        try:
            meta = read_kind_meta(sub, generation)
            if meta["kind"] != kind:
                raise layout.IndexDamagedError(
                    folder / layout.META, f"records kind {meta['kind']!r}, not {kind!r}"
                )
            integrity.check_files(folder, meta["files"], folder / layout.META)
            return folder, meta
        except layout.IndexDamagedError:
            # A missing file may be a race with two commits; damage is what stays put.
            if attempt == _OPEN_TRIES - 1 or layout.current_generation(sub) == generation:
                raise
    raise AssertionError("unreachable")
