"""``clearformer encode --input CORPUS --output DIR``: embeddings as shards and a manifest.

Run alone it writes one shard; under ``torchrun --nproc_per_node=N [--nnodes=M]`` each process
writes its own (:mod:`clearformer.sharded.shards`). Either way the run is resumable: run the same
command again after a kill and only the chunks that were not committed are encoded.

This module adds no command: it extends ``encode``'s parser with the shard options and sends
an ``--output`` directory here, so ``encode`` itself knows nothing of shards.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .encode import OUTPUT_SUFFIXES, positive_int


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.choices["encode"]
    p.add_argument(
        "--shard-format",
        choices=("npy", "parquet"),
        default="npy",
        help="with --output DIR: shard files as .npy arrays or Parquet tables with the texts "
        "(default npy)",
    )
    p.add_argument(
        "--chunk-rows",
        type=positive_int,
        default=4096,
        metavar="N",
        help="with --output DIR: texts per committed chunk, what a killed run resumes from "
        "(default 4096)",
    )
    to_file = p.get_default("func")

    def run(args: argparse.Namespace) -> int:
        return run_sharded(args) if is_shard_directory(args.output) else to_file(args)

    p.set_defaults(func=run)


def is_shard_directory(output: str | None) -> bool:
    """--output names a directory: an existing one, or a new path without a file suffix."""
    if output is None:
        return False
    path = Path(output)
    return path.is_dir() or (path.suffix not in OUTPUT_SUFFIXES and not path.suffix)


def run_sharded(args: argparse.Namespace) -> int:
    from ..cli import CliError
    from ..sharded.shards import encode_shard, launch_rank, read_manifest
    from .encode import load_encoder, read_input
    from .outputs import check_destination
    from .status_line import progress_for

    if args.similarity:
        raise CliError("--similarity prints to the terminal; it does not go with --output DIR")
    if args.input is None or args.input == "-":
        raise CliError("--output DIR needs --input FILE: every process reads the same corpus")
    if getattr(args, "dimensions", None) is not None:
        raise CliError(
            "--dimensions writes .npy, .jsonl or stdout; shards in --output DIR keep the full "
            "width (cut them when reading)"
        )
    rank, world = launch_rank()
    out = Path(args.output)
    if not out.parent.is_dir():
        raise CliError(f"--output: directory {out.parent} does not exist")
    check_destination("--output", out / "manifest.json" if out.is_dir() else out)
    if args.shard_format == "parquet":
        try:
            import pyarrow.parquet  # noqa: F401
        except ImportError:
            raise CliError(
                "--shard-format parquet needs pyarrow: pip install 'clearformer[index]'"
            ) from None
    texts = read_input([], args.input, args.field)
    from ..sharded.shards import corpus_sha256

    source = {"file": str(Path(args.input)), "sha256": corpus_sha256(Path(args.input).read_bytes())}
    encoder = load_encoder(args, hold_precision=True)
    result = encode_shard(
        texts,
        out,
        encoder,
        rank=rank,
        world=world,
        chunk_rows=args.chunk_rows,
        fmt=args.shard_format,
        normalize=args.normalize,
        precision=args.precision,
        source=source,
        batch_size=args.batch_size,
        max_tokens=args.max_tokens,
        workers=args.workers,
        progress=progress_for(args, len(texts)) if world == 1 else False,
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
    return 0


def spans(indices: tuple[int, ...]) -> str:
    """Sorted chunk indices as runs: (0, 1, 2, 5) -> "0-2, 5"."""
    runs: list[list[int]] = []
    for index in indices:
        if runs and index == runs[-1][1] + 1:
            runs[-1][1] = index
        else:
            runs.append([index, index])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
