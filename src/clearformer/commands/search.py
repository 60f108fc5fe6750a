"""``clearformer search``: rank the lines of a file by meaning, closest to a query first.

Each result is one line, ``RANK  SCORE  ID: TEXT`` (``--json``: an object with ``rank``,
``score``, ``id``, ``text``, and ``line`` for a corpus file), the id being ``FILE:LINE`` for a
corpus file, as for an index built from it (``search --index``).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

from .encode import (
    ENCODE_PRECISION_HELP,
    ENCODE_PRECISIONS,
    add_model_arguments,
    add_precision_argument,
    device_flag,
    load_encoder,
    positive_int,
)
from .status_line import progress_for

# Characters of a matching text shown per result: a corpus line can be megabytes long, and a
# terminal shows a result, not a document. --json prints the texts whole, for programs.
DISPLAY_WIDTH = 200


def non_negative_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {value!r}") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {number}")
    return number


def shorten(text: str, width: int) -> str:
    """``text`` on one line (runs of white space as one space), cut to ``width`` characters
    with the count of those left out; ``width`` 0 keeps it all."""
    flat = " ".join(text.split())
    if not width or len(flat) <= width:
        return flat
    return f"{flat[:width]}... [{len(flat) - width:,} more characters]"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "search",
        help="rank the lines of a file by meaning",
        description="Rank the texts of a corpus file (or of an index, with --index) by cosine "
        "similarity to a query. Each result is a line: rank, score, id (FILE:LINE), text.",
    )
    p.add_argument("query", metavar="QUERY", help="the text to search for")
    p.add_argument("--corpus", metavar="FILE", help="one text per line, or JSONL with --field")
    p.add_argument("--field", metavar="NAME", help="JSONL corpus: the string field to search")
    p.add_argument("-k", "--top-k", type=positive_int, default=5, help="results to show")
    p.add_argument("--json", action="store_true", help="print results as JSON lines (full texts)")
    p.add_argument(
        "--width",
        type=non_negative_int,
        default=DISPLAY_WIDTH,
        metavar="N",
        help=f"characters of each text shown (default {DISPLAY_WIDTH}; 0: all)",
    )
    p.add_argument(
        "--query-prompt-name",
        metavar="NAME",
        default=None,
        help="with --corpus: the model's named prompt for the query (default: its query prompt "
        "where it has one, else its default prompt, if any)",
    )
    p.add_argument(
        "--document-prompt-name",
        metavar="NAME",
        default=None,
        help="with --corpus: the model's named prompt for the corpus texts (default: its "
        "document prompt where it has one, else its default prompt, if any)",
    )
    add_precision_argument(p, ENCODE_PRECISIONS, ENCODE_PRECISION_HELP)
    add_model_arguments(p)
    p.set_defaults(func=run)


def read_corpus(args: argparse.Namespace) -> list[tuple[int, str]]:
    """The QUERY checked and the ``--corpus`` texts to rank, as (line number, text) pairs.

    Shared by ``search`` and ``rerank``: one set of checks and messages for both.
    """
    from ..checks import check_unicode
    from ..cli import CliError
    from ..io import read_numbered_texts
    from .inputs import is_jsonl, require_input_file

    path = require_input_file(args.corpus, "--corpus")
    if not args.query.strip():
        raise CliError("QUERY is empty")
    check_unicode(args.query, "QUERY")
    field = args.field if args.field is not None or not is_jsonl(path) else "text"
    texts = read_numbered_texts(path.read_bytes(), str(path), field=field)
    # Blank lines carry no meaning to rank; keep each text's line number for the output (a
    # JSONL file's, not its place among the texts: an index names the same line).
    entries = [(number, text) for number, text in texts if text.strip()]
    if not entries:
        raise CliError(f"empty input: {path} holds no non-blank texts")
    return entries


def corpus_route(kind: str, model: str) -> str:
    """What a ``--corpus`` search (dense alone) says of a ``kind`` model: index the corpus as
    that kind, then search the index."""
    kind_flag = "--kind dense" if kind == "bge-m3" else f"--kind {kind}"  # bge-m3's dense view
    return (
        f"a --corpus search ranks with a dense model: build an index with `clearformer index "
        f"build {kind_flag} --corpus FILE --out INDEX --model {model}`, then search --index INDEX"
    )


def prompt_names(encoder, args: argparse.Namespace) -> tuple[str | None, str | None]:
    """The (query, document) prompt names a ``--corpus`` search embeds with: the flags', each
    checked to be one of the model's before any text is embedded; else the model's ``query``
    and ``document`` prompts where it has them, as sentence-transformers' encode_query and
    encode_document take them and a retrieval model is meant to be used (Qwen3-Embedding,
    EmbeddingGemma, ``train --task contrastive --query-prompt``); else None: no prompt
    (:func:`~clearformer.text.prompts.side_prompt_options`)."""
    from ..text.prompts import side_prompt_name
    from .encode import check_prompt_name

    chosen = []
    for flag, side in (("--query-prompt-name", "query"), ("--document-prompt-name", "document")):
        name = getattr(args, flag[2:].replace("-", "_"))
        check_prompt_name(encoder, flag, name)
        chosen.append(name if name is not None else side_prompt_name(encoder.prompts.prompts, side))
    return chosen[0], chosen[1]


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from ..cli import CliError
    from .outputs import check_finite

    if args.corpus is None:
        raise CliError("give --corpus FILE (rank its lines) or --index INDEX")
    device_flag(args)  # before the corpus is read
    from ..text.prompts import side_prompt_options

    entries = read_corpus(args)
    encoder = load_encoder(args, route=functools.partial(corpus_route, model=args.model))
    query_prompt, document_prompt = prompt_names(encoder, args)
    corpus = encoder.encode(
        [t for _, t in entries],
        batch_size=args.batch_size,
        max_tokens=args.max_tokens,
        workers=args.workers,
        normalize=True,
        progress=progress_for(args, len(entries)),
        precision=args.precision,
        **side_prompt_options(document_prompt),
    )  # (n, D), unit rows
    check_finite(corpus, [t for _, t in entries])
    query = encoder.encode(
        [args.query], normalize=True, precision=args.precision, **side_prompt_options(query_prompt)
    )[0]  # (D,)
    check_finite(query[None, :], [args.query])
    scores = corpus @ query  # (n,) cosine similarities
    k = min(args.top_k, len(entries))
    # Stable sort on -score: equal scores keep file order.
    best = np.argsort(-scores, kind="stable")[:k]
    name = Path(args.corpus).name
    for rank, i in enumerate(best, start=1):
        number, text = entries[i]
        # A text's id is FILE:LINE, as `index build` names the texts of this file: one result
        # reads the same from --corpus and from --index.
        ident = f"{name}:{number}"
        if args.json:
            score = round(float(scores[i]), 6)
            item = {"rank": rank, "score": score, "id": ident, "line": number, "text": text}
            print(json.dumps(item, ensure_ascii=False))
        else:
            print(f"{rank:>3}  {scores[i]:.4f}  {ident}: {shorten(text, args.width)}")
    sys.stdout.flush()
    return 0
