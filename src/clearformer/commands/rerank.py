"""``clearformer rerank``: rank the lines of a file by a cross-encoder's score for a query.

Where ``search`` compares separate embeddings, ``rerank`` reads the query and each line
together through a cross-encoder (a ``*ForSequenceClassification`` checkpoint with one label),
which judges relevance better at one forward pass per line: the usual second stage after a
search has cut a corpus down to a few hundred candidates.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..options import BACKENDS
from ..precision.names import CROSS_ENCODER_PRECISIONS
from ..text.batching import DEFAULT_MAX_TOKENS
from .encode import add_precision_argument, add_workers_argument, positive_int
from .search import DISPLAY_WIDTH, non_negative_int, read_corpus, shorten

RERANK_PRECISIONS = CROSS_ENCODER_PRECISIONS  # what CrossEncoder.predict runs
RERANK_PRECISION_HELP = (
    "bf16 (bfloat16): bfloat16 matrix products, several times faster on CPUs with AMX, "
    "scores close to float32's; int8-blocks: int8 weights scaled per block of 32, 16-bit "
    "activations (AVX512-VNNI)"
)


def load_scorer(path: str, flag: str, precision: str, precision_flag: str, device):
    """The cross-encoder of ``flag`` (``--rerank``, ``--cross-encoder``) that a command scores
    pairs with, refused in one line before any text is embedded where its head gives more
    than one score per pair, or where it cannot run ``precision`` there (int8-blocks on a
    GPU)."""
    from ..cli import CliError
    from ..text import CrossEncoder

    cross_encoder = CrossEncoder.from_pretrained(path, device=device)
    if cross_encoder.num_labels != 1:
        raise CliError(
            f"{flag} {path}: pairs are scored with one score each, this cross-encoder's head "
            f"gives num_labels={cross_encoder.num_labels}"
        )
    try:
        cross_encoder.precision_for(precision)
    except ValueError as exc:
        raise CliError(f"{precision_flag} {precision}: {exc}") from None
    return cross_encoder


# No cross-encoder ships with clearformer (the bundled model is an embedding model), and none
# is downloaded at run time: the user brings a directory.
MISSING_MODEL = (
    "--model DIR is required: no cross-encoder is bundled. Give a local directory of a "
    "sentence-transformers CrossEncoder or a Hugging Face *ForSequenceClassification "
    "checkpoint with one label, for example one saved on a machine with network access by "
    "sentence_transformers.CrossEncoder('cross-encoder/ms-marco-MiniLM-L6-v2')"
    ".save_pretrained('reranker') and copied here"
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "rerank",
        help="rank the lines of a file with a cross-encoder",
        description="Score each text of a corpus file against a query with a cross-encoder "
        "(a sequence-classification checkpoint with one label) and print the best first.",
    )
    p.add_argument("query", metavar="QUERY", help="the text to rank the corpus against")
    p.add_argument(
        "--corpus", required=True, metavar="FILE", help="one text per line, or JSONL with --field"
    )
    # Not required by the parser: without it, run() says how to get a cross-encoder, which
    # a bare "the following arguments are required" cannot.
    p.add_argument(
        "--model",
        metavar="DIR",
        help="cross-encoder checkpoint directory (required: none is bundled)",
    )
    p.add_argument("--field", metavar="NAME", help="JSONL corpus: the string field to rank")
    p.add_argument(
        "-k", "--top-k", type=positive_int, default=5, help="results to show (default 5)"
    )
    p.add_argument("--json", action="store_true", help="print results as JSON lines (full texts)")
    p.add_argument(
        "-o", "--output", metavar="FILE", help="write the results as JSON lines to FILE.jsonl"
    )
    p.add_argument(
        "--width",
        type=non_negative_int,
        default=DISPLAY_WIDTH,
        metavar="N",
        help=f"characters of each text shown (default {DISPLAY_WIDTH}; 0: all)",
    )
    p.add_argument(
        "--batch-size",
        type=positive_int,
        default=None,
        metavar="N",
        help="pairs per forward pass (default: as many as fit in --max-tokens)",
    )
    p.add_argument(
        "--max-tokens",
        type=positive_int,
        default=DEFAULT_MAX_TOKENS,
        metavar="N",
        help=f"padded tokens per forward pass without --batch-size (default {DEFAULT_MAX_TOKENS})",
    )
    add_workers_argument(p)
    add_precision_argument(p, RERANK_PRECISIONS, RERANK_PRECISION_HELP)
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        default="auto",
        help="attention backend (auto packs ragged batches)",
    )
    p.set_defaults(
        func=run,
        writes_stdout=lambda args: args.output is None,
        stdout_hint="; give --output FILE.jsonl",
    )


def _check_model(model: str | None) -> str:
    """The checkpoint directory; without one, how to get a cross-encoder (none is bundled)."""
    from ..cli import CliError

    if model is None:
        raise CliError(MISSING_MODEL)
    return model


def _check_output(output: str | None) -> Path | None:
    from ..cli import CliError
    from .outputs import check_destination

    if output is None:
        return None
    if Path(output).suffix != ".jsonl":
        raise CliError(f"--output must end in .jsonl, got {output!r}")
    return check_destination("--output", output)


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from ..cli import CliError
    from ..io import atomic_write
    from ..text import CrossEncoder
    from .inputs import check_model_directory

    model_dir = _check_model(args.model)  # before any work
    output = _check_output(args.output)
    check_model_directory(model_dir)
    entries = read_corpus(args)
    model = CrossEncoder.from_pretrained(model_dir, backend=args.backend)
    if model.num_labels != 1:
        raise CliError(
            f"--model {args.model}: rerank needs a cross-encoder with one score per pair, this "
            f"one has num_labels={model.num_labels} {list(model.labels) or ''}".rstrip()
        )
    scores = model.predict(
        [(args.query, text) for _, text in entries],
        batch_size=args.batch_size,
        max_tokens=args.max_tokens,
        workers=args.workers,
        precision=args.precision,
    )  # (n,)
    bad = np.flatnonzero(~np.isfinite(scores))
    if len(bad):
        raise CliError(
            f"the scores of {len(bad)} of {len(entries)} texts are not finite (NaN or "
            f"infinity; the checkpoint's weights may be damaged), first at line "
            f"{entries[int(bad[0])][0]}; nothing was written"
        )
    # Stable sort on -score: equal scores keep file order.
    best = np.argsort(-scores, kind="stable")[: min(args.top_k, len(entries))]
    rows = [
        {
            "rank": rank,
            "score": round(float(scores[i]), 6),
            "line": entries[i][0],
            "text": entries[i][1],
        }
        for rank, i in enumerate(best, start=1)
    ]
    if output is not None:
        with atomic_write(output) as handle:
            for row in rows:
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")
        print(f"wrote {len(rows)} results to {output}", file=sys.stderr)
        return 0
    for row in rows:
        if args.json:
            print(json.dumps(row, ensure_ascii=False))
        else:
            shown = shorten(row["text"], args.width)
            print(f"{row['rank']:>3}  {row['score']:.4f}  line {row['line']}: {shown}")
    sys.stdout.flush()
    return 0
