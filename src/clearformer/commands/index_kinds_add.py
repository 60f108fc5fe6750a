"""``clearformer index add INDEX --corpus FILE`` on a folder of kinds: the new texts appended to
its texts store and to every kind it holds (``clearformer.index.kinds_add``).

Each kind's texts are encoded by that kind's own model: ``--model`` (dense), ``--sparse-model``,
``--multivector-model``, by default the model the kind records; bm25 needs none. Every check
comes before any encoding: the corpus, each model's kind (a multi-vector model given as
``--sparse-model`` is refused naming both kinds) and identity (another model is refused naming
both). A killed add resumes when run again; an add of texts all held adds nothing and says so.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

_FLAGS = {"dense": "--model", "sparse": "--sparse-model", "multivector": "--multivector-model"}


def add_kind_model_arguments(add: argparse.ArgumentParser) -> None:
    """``index add``'s flags for the models of a folder's sparse and multi-vector kinds."""
    add.add_argument(
        "--sparse-model",
        metavar="DIR",
        help="a folder of kinds: its sparse index's model (default: the one it records)",
    )
    add.add_argument(
        "--multivector-model",
        metavar="DIR",
        help="a folder of kinds: its multi-vector index's model (default: the one it records)",
    )


def refuse_kind_model_flags(args: argparse.Namespace) -> None:
    """A plain dense index takes neither of the other kinds' model flags."""
    from ..cli import CliError

    for flag in ("--sparse-model", "--multivector-model"):
        if getattr(args, flag[2:].replace("-", "_")) is not None:
            raise CliError(f"{flag} applies to an index folder of kinds, not a dense index")


def run_kind_add(args: argparse.Namespace) -> int:
    from ..cli import CliError
    from ..index import add_to_kinds
    from ..index.collection import kinds_present
    from .index import _Chunks, _status, _writing, read_corpus_file
    from .search_kinds import refuse_model_flags

    path = Path(args.index)
    present = kinds_present(path)
    if not present:
        raise CliError(f"INDEX {path} holds no committed index of any kind: build one first")
    for kind, flag in _FLAGS.items():
        if getattr(args, flag[2:].replace("-", "_")) is not None and kind not in present:
            raise CliError(f"{flag}: {path} holds no {kind} index (it holds {', '.join(present)})")
    if present == ["bm25"]:
        refuse_model_flags(args, f"an add to {path} (bm25 alone)")
    texts, ids, source = read_corpus_file(args)
    models = {kind: _model(args, path, kind) for kind in present if kind != "bm25"}
    chunks = _Chunks()
    status = _status("add", args)
    progress = status.progress("encoding", "texts")
    dense_options = {
        "source": source,
        "max_tokens": args.max_tokens,
        "workers": args.workers,
        "graph_progress": status.progress("inserting into the graph", "vectors"),
    }
    added = _writing(
        lambda: add_to_kinds(
            path, texts, models, ids=ids, on_chunk=chunks, progress=progress or False,
            batch_size=args.batch_size,
            **(dense_options if "dense" in present else {}),
        ),
        status,
        args,
    )  # fmt: skip
    _report(added, chunks, len(texts))
    return 0


def _model(args: argparse.Namespace, path: Path, kind: str):
    """The ``kind`` index's model: its flag, else the model the kind records (the dense kind:
    else the bundled one, as the dense add); its checkpoint's kind checked first."""
    from .search_kinds import _dense_model
    from .search_kinds import _model as kind_model

    if kind != "dense":
        return kind_model(args, path, kind)
    from .kind_models import check_model_kind

    if args.model is not None:
        check_model_kind("dense", args.model, "--model")
    return _dense_model(args, path, hold=getattr(args, "hold_precision", False))


def _report(added, chunks, given: int) -> None:
    """How many texts were added and the total, then each kind's rows."""
    path = added.path
    if not added.changed:
        print(
            f"{path} already holds these {given:,} texts: 0 added; it holds {added.rows:,} texts",
            file=sys.stderr,
        )
        return
    resumed = f", {chunks.reused} chunk(s) reused" if chunks.reused else ""
    held = f" ({added.held:,} already held)" if added.held else ""
    print(
        f"added {added.added:,} texts to {path}{held}: it holds {added.rows:,} texts "
        f"({chunks.encoded} chunk(s) encoded{resumed})",
        file=sys.stderr,
    )
    for kind, (before, after) in added.kinds.items():
        print(f"  {kind:<11} added {after - before:,} texts: it holds {after:,}", file=sys.stderr)
