"""``clearformer mine``: hard negatives for (anchor, positive) pairs, through a persistent index,
written as the JSONL rows ``clearformer train --task contrastive`` reads."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from .encode import (
    ENCODE_PRECISION_HELP,
    ENCODE_PRECISIONS,
    add_model_arguments,
    add_precision_argument,
    positive_int,
)
from .rerank import RERANK_PRECISION_HELP, RERANK_PRECISIONS


def _non_negative_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value!r}") from None
    if not number >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value!r}")
    return number


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "mine",
        help="hard negatives for (anchor, positive) pairs, through an index",
        description="Embed a corpus once into an index, search it for every anchor, and keep "
        "the nearest texts that are not its positives (within the rank range and margins) as "
        "hard negatives. Writes JSONL rows {anchor, positive, negative: [...]}.",
    )
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--pairs",
        metavar="FILE",
        help="(anchor, positive) rows: JSONL, CSV or TSV (as train reads them)",
    )
    source.add_argument(
        "--data",
        metavar="DIR",
        help="a BEIR folder: its --split's queries and relevant documents are "
        "the pairs, its corpus the texts negatives come from",
    )
    p.add_argument("--split", default="train", help="with --data: the qrels file (default train)")
    p.add_argument(
        "--corpus",
        metavar="FILE",
        help="with --pairs: more texts to draw negatives from, one per line",
    )
    p.add_argument("--out", required=True, metavar="FILE.jsonl", help="the rows to write")
    p.add_argument(
        "--index",
        metavar="DIR",
        help="the corpus index (default: OUT.index; reused when it holds these texts; a "
        "folder named here that holds other texts is refused, never replaced)",
    )
    p.add_argument(
        "-n", "--negatives", type=positive_int, default=3, help="negatives per anchor (default 3)"
    )
    p.add_argument("--range-min", type=int, default=0, help="nearest ranks skipped (default 0)")
    p.add_argument(
        "--range-max",
        type=positive_int,
        default=50,
        help="candidates looked at per anchor (default 50)",
    )
    p.add_argument(
        "--absolute-margin",
        type=_non_negative_float,
        default=None,
        help="a negative scores at least this much below the positive",
    )
    p.add_argument(
        "--relative-margin",
        type=_non_negative_float,
        default=None,
        help="a negative scores at most positive - |positive| x this",
    )
    p.add_argument("--max-score", type=float, default=None, help="a negative scores at most this")
    p.add_argument("--min-score", type=float, default=None, help="a negative scores at least this")
    p.add_argument(
        "--sampling",
        choices=("top", "random"),
        default="top",
        help="top: the best-ranked survivors; random: drawn from them (default top)",
    )
    p.add_argument("--seed", type=int, default=0, help="for --sampling random (default 0)")
    p.add_argument(
        "--cross-encoder",
        metavar="DIR",
        help="rescore the candidates and the positive with this cross-encoder",
    )
    add_precision_argument(
        p,
        RERANK_PRECISIONS,
        "with --cross-encoder: what it scores in; " + RERANK_PRECISION_HELP,
        flag="--cross-encoder-precision",
    )
    add_model_arguments(p)
    add_precision_argument(
        p,
        ENCODE_PRECISIONS,
        "what the corpus and the anchors are embedded in (the index records it; an index of "
        "another precision is built again); " + ENCODE_PRECISION_HELP,
    )
    p.set_defaults(func=run, writes_stdout=lambda args: False)


def _pairs(args) -> tuple[list[tuple[str, str]], list[str], int]:
    """(the (anchor, positive) pairs, the corpus, the --data pairs left out because the query's
    text is its document's)."""
    from ..cli import CliError
    from ..retrieval import DataError, load_beir
    from ..train.pairs import read_pairs

    if args.data is not None:
        if args.corpus is not None:
            raise CliError("--corpus is for --pairs; a BEIR folder's corpus is used with --data")
        try:
            data = load_beir(args.data, args.split)
        except DataError as exc:
            raise CliError(str(exc)) from None
        text = dict(zip(data.corpus_ids, data.corpus_texts, strict=True))
        queries = dict(zip(data.query_ids, data.query_texts, strict=True))
        relevant = [
            (queries[q], text[d])
            for q in data.query_ids
            for d, level in data.qrels[q].items()
            if level >= 1
        ]
        # A query whose text is its document's (a benchmark of duplicate questions has them)
        # teaches nothing, and train refuses the row: left out, and counted in the report.
        pairs = [(a, p) for a, p in relevant if a.strip() != p.strip()]
        return pairs, data.corpus_texts, len(relevant) - len(pairs)
    try:
        rows = read_pairs(args.pairs, name="--pairs")
    except (OSError, ValueError) as exc:
        raise CliError(str(exc)) from None
    corpus = [] if args.corpus is None else _corpus(Path(args.corpus))
    return [(r.anchor, r.positive) for r in rows], corpus, 0


def _corpus(path: Path) -> list[str]:
    """``--corpus``: its non-blank lines, stripped; a byte-order mark is not text, and bytes
    that are not UTF-8 are named by file and line."""
    from ..cli import CliError
    from ..train.pairs import utf8_text

    if not path.is_file():
        raise CliError(f"--corpus {path}: no such file")
    try:
        text = utf8_text(path)
    except ValueError as exc:
        raise CliError(f"--corpus {exc}") from None
    return [line.strip() for line in text.splitlines() if line.strip()]


# MiningSettings names its fields; the command's errors name the flags.
_FLAGS = re.compile(
    r"\b(negatives|range_min|range_max|absolute_margin|relative_margin|max_score|min_score)\b"
)


def _in_flags(message: str) -> str:
    return _FLAGS.sub(lambda m: "--" + m.group(1).replace("_", "-"), message)


def _check_paths(args, out: Path) -> None:
    """Before any work: --index can be a folder, no model flag names a missing directory, and
    --out is none of the files the command reads (it would replace its own input)."""
    from ..cli import CliError
    from .inputs import same_file

    if args.index is not None and Path(args.index).exists() and not Path(args.index).is_dir():
        raise CliError(f"--index {args.index}: is a file; give the folder of the corpus index")
    if args.cross_encoder is not None:
        _check_model_dir("--cross-encoder", args.cross_encoder)
    inputs = [
        ("the --pairs file", args.pairs),
        ("the --corpus file", args.corpus),
        ("the --index folder", args.index),
    ]
    if args.data is not None:
        data, split = Path(args.data), args.split
        inputs += [
            (f"the corpus of --data {data}", data / "corpus.jsonl"),
            (f"the queries of --data {data}", data / "queries.jsonl"),
            (f"the qrels of --data {data} --split {split}", data / "qrels" / f"{split}.tsv"),
        ]
    for what, path in inputs:
        if path is not None and same_file(out, Path(path)):
            raise CliError(
                f"--out {out} is {what} ({path}): the mined rows would replace it; give "
                "another --out"
            )


def _check_model_dir(flag: str, path: str) -> None:
    """A model directory a flag names: there, and holding a checkpoint's files (its weights
    are read later, once every input has been checked)."""
    from ..cli import CliError
    from ..interop.hf.files import CheckpointError, find_checkpoint

    if not Path(path).is_dir():
        raise CliError(f"{flag} {path}: no such directory")
    try:
        find_checkpoint(path)
    except CheckpointError as exc:
        raise CliError(f"{flag} {path}: {exc}") from None


def run(args: argparse.Namespace) -> int:
    from ..cli import CliError
    from ..io import atomic_write
    from ..retrieval.mining import (
        MiningSettings,
        check_index_holds,
        corpus_texts,
        mine_hard_negatives,
    )
    from .encode import batching_options, device_flag, load_encoder
    from .phase_progress import PhaseProgress

    device_flag(args)  # before any input is read
    out = Path(args.out)
    if not out.parent.is_dir():
        raise CliError(f"--out {out}: the folder {out.parent} does not exist")
    if out.is_dir():  # refused now, not after the corpus is embedded
        raise CliError(f"--out {out}: is a folder; give the JSONL file to write")
    _check_paths(args, out)
    try:
        settings = MiningSettings(
            negatives=args.negatives,
            range_min=args.range_min,
            range_max=args.range_max,
            absolute_margin=args.absolute_margin,
            relative_margin=args.relative_margin,
            max_score=args.max_score,
            min_score=args.min_score,
            sampling=args.sampling,
            seed=args.seed,
        )
    except ValueError as exc:
        raise CliError(_in_flags(str(exc))) from None
    if args.cross_encoder is None and args.cross_encoder_precision != "float32":
        raise CliError("--cross-encoder-precision applies with --cross-encoder DIR")
    pairs, corpus, same = _pairs(args)
    if not pairs:
        why = f" ({same:,} left out: the query's text is its document's)" if same else ""
        raise CliError(f"no (anchor, positive) pairs to mine for{why}")
    if args.index is not None:
        # OUT.index is mine's own, built again at will; a folder the user names may hold an
        # index made for something else, which the build would replace.
        try:
            check_index_holds(args.index, corpus_texts(pairs, corpus))
        except ValueError as exc:
            raise CliError(f"--index {exc}") from None
    cross_encoder = None
    if args.cross_encoder is not None:
        from .rerank import load_scorer

        cross_encoder = load_scorer(
            args.cross_encoder,
            "--cross-encoder",
            args.cross_encoder_precision,
            "--cross-encoder-precision",
            device_flag(args),
        )
    encoder = load_encoder(args, hold_precision=True)  # every call runs --precision
    progress = PhaseProgress("mine", enabled=args.progress is not False)
    rows, report = mine_hard_negatives(
        pairs,
        encoder,
        args.index or str(out) + ".index",
        corpus=corpus,
        settings=settings,
        cross_encoder=cross_encoder,
        precision=args.precision,
        cross_encoder_precision=args.cross_encoder_precision if cross_encoder else None,
        progress=progress,
        encode_options=batching_options(args),
    )
    with atomic_write(out) as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    left_out = f"; pairs left out, the query's text being its document's: {same:,}"
    print(
        f"mine: wrote {out}: {report.rows:,} rows, {report.negatives:,} negatives for "
        f"{report.anchors:,} anchors from {report.corpus:,} texts ({report.without_negatives:,} "
        f"rows without a negative; candidates dropped: {report.dropped}"
        f"{left_out if same else ''})",
        file=sys.stderr,
    )
    return 0
