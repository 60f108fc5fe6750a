"""``clearformer search QUERY --index INDEX``: the nearest texts of a built index.

The query is embedded by the index's own model (``--model`` must be that model; the index
refuses another), then searched as the index was built to search (graph or scan, rescored in
float32). Output as ``search --corpus``: one line per result, or ``--json`` lines.

This module adds no command: it gives ``search`` its ``--index`` option and sends such a
search here.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.choices["search"]
    p.add_argument(
        "--index",
        metavar="INDEX",
        help="search an index built by `clearformer index build` instead of a corpus file",
    )
    from .search_kinds import add_kind_arguments

    add_kind_arguments(p)
    over_corpus = p.get_default("func")

    def run(args: argparse.Namespace) -> int:
        if args.index is None:
            from ..cli import CliError
            from .search_kinds import refuse_kind_flags

            if args.mode is not None:
                raise CliError("--mode applies to --index; a --corpus search is dense")
            refuse_kind_flags(args, corpus=True)
        return run_index_search(args) if args.index is not None else over_corpus(args)

    p.set_defaults(func=run)


def run_index_search(args: argparse.Namespace) -> int:
    from ..checks import check_unicode
    from ..cli import CliError
    from ..index import VectorIndex
    from .index import _require_engine, _require_index, index_encoder
    from .search import shorten

    if args.corpus is not None:
        raise CliError("give --corpus FILE or --index INDEX, not both")
    if args.field is not None:
        raise CliError("--field applies to --corpus; an index keeps the texts it was built from")
    for flag, given in (
        ("--query-prompt-name", getattr(args, "query_prompt_name", None)),
        ("--document-prompt-name", getattr(args, "document_prompt_name", None)),
    ):
        if given is not None:
            raise CliError(f"{flag} applies to --corpus, not an --index search")
    if not args.query.strip():
        raise CliError("QUERY is empty")
    check_unicode(args.query, "QUERY")
    path = Path(args.index)
    from ..index.collection import is_collection

    if is_collection(path) or args.mode not in (None, "dense"):
        from .search_kinds import run_kind_search

        return run_kind_search(args, path)
    from .search_kinds import refuse_kind_flags

    refuse_kind_flags(args)
    _require_index(path)
    _require_engine()
    index = VectorIndex.open(path)
    encoder = index_encoder(args, path)
    index = index.with_encoder(encoder)
    hits = index.search(args.query, k=args.top_k, precision=args.precision)
    for rank, hit in enumerate(hits, start=1):
        if args.json:
            item = {"rank": rank, "score": round(hit.score, 6), "id": hit.id, "text": hit.text}
            print(json.dumps(item, ensure_ascii=False))
        else:
            print(f"{rank:>3}  {hit.score:.4f}  {hit.id}: {shorten(hit.text, args.width)}")
    sys.stdout.flush()
    return 0
