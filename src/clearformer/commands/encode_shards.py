"""``clearformer encode --input CORPUS --output DIR``: embeddings as shards and a manifest.

Run alone it writes one shard; under ``torchrun --nproc_per_node=N [--nnodes=M]`` each process
writes its own (:mod:`clearformer.sharded.shards`). Either way the run is resumable: run the same
command again after a kill and only the chunks that were not committed are encoded.

This module adds no command: it extends ``encode``'s parser with the shard options and sends
an ``--output`` directory here, so ``encode`` itself knows nothing of shards. An ``--output``
names a directory of shards when it ends in a path separator (``corpus.emb/``), names an
existing directory, or has no suffix; the directory is made if missing.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
from pathlib import Path

from .encode import positive_int

SHARD_FORMAT = "npy"  # --shard-format's default
CHUNK_ROWS = 4096  # --chunk-rows'


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.choices["encode"]
    # Both default to None, so that one given without --output DIR is refused, not ignored.
    p.add_argument(
        "--shard-format",
        choices=("npy", "parquet"),
        default=None,
        help="with --output DIR: shard files as .npy arrays or Parquet tables with the texts "
        f"(default {SHARD_FORMAT})",
    )
    p.add_argument(
        "--chunk-rows",
        type=positive_int,
        default=None,
        metavar="N",
        help="with --output DIR: texts per committed chunk, what a killed run resumes from "
        f"(default {CHUNK_ROWS})",
    )
    to_file = p.get_default("func")

    def run(args: argparse.Namespace) -> int:
        if is_shard_directory(args.output):
            return run_sharded(args)
        refuse_shard_options(args)
        return to_file(args)

    p.set_defaults(func=run)


def is_shard_directory(output: str | None) -> bool:
    """--output names a directory: one written as such (a trailing separator), an existing
    one, or a path without a suffix (``corpus.emb`` is refused as a file name with an unknown
    suffix: write ``corpus.emb/``)."""
    if output is None:
        return False
    if output.endswith(os.sep) or (os.altsep is not None and output.endswith(os.altsep)):
        return True
    path = Path(output)
    return path.is_dir() or not path.suffix


def refuse_shard_options(args: argparse.Namespace) -> None:
    """The shard options go with --output DIR alone: elsewhere they would be ignored."""
    from ..cli import CliError

    where = f"--output {args.output}" if args.output is not None else "stdout"
    for flag, value in (("--shard-format", args.shard_format), ("--chunk-rows", args.chunk_rows)):
        if value is not None:
            raise CliError(
                f"{flag} applies to --output DIR (a directory of shards, e.g. corpus.emb/); "
                f"got {where}"
            )


def check_shard_directory(output: str) -> Path:
    """--output DIR as a Path, checked before any work: not a file, its parent a directory,
    and writable there."""
    from ..cli import CliError
    from .outputs import check_destination

    out = Path(output)
    if out.exists() and not out.is_dir():
        raise CliError(
            f"--output: {out} is a file; expected a directory of shards, or FILE.npy / FILE.jsonl"
        )
    if not out.parent.is_dir():
        raise CliError(f"--output: directory {out.parent} does not exist")
    check_destination("--output", out / "manifest.json" if out.is_dir() else out)
    return out


def run_sharded(args: argparse.Namespace) -> int:
    from ..cli import CliError
    from ..sharded.shards import (
        CHUNKS,
        corpus_sha256,
        encode_shard,
        launch_rank,
        read_manifest,
    )
    from .encode import check_prompt_flags, encode_route, load_encoder, read_input_file
    from .kind_models import refuse_other_kind
    from .status_line import encode_progress

    if args.similarity:
        raise CliError("--similarity prints to the terminal; it does not go with --output DIR")
    if args.input is None or args.input == "-" or args.texts:
        raise CliError("--output DIR needs --input FILE: every process reads the same corpus")
    if getattr(args, "dimensions", None) is not None:
        raise CliError(
            "--dimensions writes .npy, .jsonl or stdout; shards in --output DIR keep the full "
            "width (cut them when reading)"
        )
    # Shards hold dense embeddings: a model of another kind is refused before any input read.
    route = functools.partial(encode_route, model=args.model)
    refuse_other_kind(args.model, route)
    rank, world = launch_rank()
    out = check_shard_directory(args.output)
    fmt = args.shard_format or SHARD_FORMAT
    if fmt == "parquet":
        try:
            import pyarrow.parquet  # noqa: F401
        except ImportError:
            raise CliError(
                "--shard-format parquet needs pyarrow: pip install 'clearformer[index]'"
            ) from None
    texts, data = read_input_file(args.input, args.field)  # read once: -i may be a pipe
    source = {"file": str(Path(args.input)), "sha256": corpus_sha256(data)}
    encoder = load_encoder(args, hold_precision=True, route=route)
    prompts = check_prompt_flags(encoder, args)  # recorded in the job: a resume keeps it
    chunk_rows = args.chunk_rows or CHUNK_ROWS
    # A lone process shows a bar; several would draw over each other's line, so each rank
    # prints a line of its own per chunk instead (unless --no-progress).
    lines = None
    if world > 1 and args.progress is not False:
        lines = ChunkLines(rank, world, len(texts), chunk_rows)
    progress = encode_progress(args, len(texts)) if world == 1 else contextlib.nullcontext(False)
    with progress as shown:  # its line ended before the messages below
        result = encode_shard(
            texts,
            out,
            encoder,
            rank=rank,
            world=world,
            chunk_rows=chunk_rows,
            fmt=fmt,
            normalize=args.normalize,
            precision=args.precision,
            source=source,
            batch_size=args.batch_size,
            max_tokens=args.max_tokens,
            workers=args.workers,
            progress=shown,
            on_chunk=lines,
            **prompts,
        )
    who = f"rank {rank}/{world}: " if world > 1 else ""
    if result.file is None:
        cleaned = (
            f" (removed what a killed run left: {', '.join(result.cleaned)})"
            if result.cleaned
            else ""
        )
        print(
            f"{who}{out} already holds this run's shards: nothing to do{cleaned}", file=sys.stderr
        )
        return 0
    start, stop = result.rows
    if result.kept:
        print(
            f"{who}kept {out / result.file}, written by an earlier run: rows {start}-{stop} "
            f"(chunks {spans(result.reused_chunks)} reused)",
            file=sys.stderr,
        )
    else:
        resumed = (
            f", {result.reused} reused: chunks {spans(result.reused_chunks)}"
            if result.reused
            else ""
        )
        print(
            f"{who}wrote {out / result.file}: rows {start}-{stop} ({result.encoded} chunk(s) "
            f"encoded{resumed})",
            file=sys.stderr,
        )
    if result.manifest:
        manifest = read_manifest(out)
        print(
            f"wrote {out / 'manifest.json'}: {manifest['rows']} x {manifest['dimensions']} "
            f"embeddings in {manifest['world']} shard(s)",
            file=sys.stderr,
        )
    # This job's chunks go once its manifest is written, as every run's do: only the files of
    # an earlier run (another process count, a killed write) are news.
    earlier = [name for name in result.cleaned if name != CHUNKS]
    if earlier:
        print(
            f"{who}removed what an earlier run of this job left in {out}: {', '.join(earlier)}",
            file=sys.stderr,
        )
    return 0


class ChunkLines:
    """One stderr line per chunk a rank commits or reuses, for a run of several processes:
    ``rank 1/2: chunk 7 (rows 28,672-32,768) committed: 12,288/20,480 rows, 410 rows/s,
    0:20 left``. A line each, newline-ended, so that ranks sharing a terminal or a log file
    do not draw over each other; the rate counts the rows this run embedded, not the
    reused ones (a resumed rank's reused chunks would pass for work done fast)."""

    def __init__(self, rank: int, world: int, rows: int, chunk_rows: int) -> None:
        import time

        from ..sharded.shards import rank_chunks

        self.who = f"rank {rank}/{world}"
        self.rows, self.chunk_rows = rows, chunk_rows
        chunks = rank_chunks(rows, chunk_rows, rank, world)
        self.total = max(min(chunks.stop * chunk_rows, rows) - chunks.start * chunk_rows, 0)
        self.done = self.embedded = 0
        self.clock = time.monotonic
        self.started = self.clock()

    def __call__(self, index: int, reused: bool) -> None:
        from ..text.progress import describe_progress

        start = index * self.chunk_rows
        stop = min(start + self.chunk_rows, self.rows)
        self.done += stop - start
        if not reused:
            self.embedded += stop - start
        elapsed = self.clock() - self.started
        rate = self.embedded / elapsed if self.embedded and elapsed > 0 else None
        left = (self.total - self.done) / rate if rate else None
        state = "reused" if reused else "committed"
        print(
            f"{self.who}: chunk {index} (rows {start:,}-{stop:,}) {state}: "
            f"{describe_progress(self.done, self.total, 'rows', rate, left)}",
            file=sys.stderr,
            flush=True,
        )


def spans(indices: tuple[int, ...]) -> str:
    """Sorted chunk indices as runs: (0, 1, 2, 5) -> "0-2, 5"."""
    runs: list[list[int]] = []
    for index in indices:
        if runs and index == runs[-1][1] + 1:
            runs[-1][1] = index
        else:
            runs.append([index, index])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
