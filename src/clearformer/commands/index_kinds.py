"""``clearformer index build --kind KIND``: one kind (dense, sparse, multivector, bm25) of a
folder of kinds over one corpus (``clearformer.index.collection``); ``index info`` and
``index add`` of such a folder (the add: :mod:`.index_kinds_add`).

Every check comes before any encoding: the kind's options, the destination, the corpus
against the texts the folder already holds, and the model's kind (a sparse model for a dense
build is refused naming both kinds). A killed build resumes, as the dense build does.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

KINDS = ("dense", "sparse", "multivector", "bm25")  # as clearformer.index.collection


def register(sub: argparse._SubParsersAction) -> None:
    """Give ``index build`` its ``--kind`` option and send such a build here."""
    index = sub.choices["index"]
    actions = next(a for a in index._actions if isinstance(a, argparse._SubParsersAction))
    build = actions.choices["build"]
    build.add_argument(
        "--kind",
        choices=KINDS,
        default=None,
        help="build this kind into INDEX as a folder of kinds over one corpus (dense, sparse, "
        "multivector, bm25; several kinds share its texts; bm25 needs no --model); without "
        "--kind, dense: INDEX is a dense index as before, or a folder of kinds gains dense",
    )
    build.add_argument(
        "--engine",
        choices=("exact", "seismic"),
        default=None,
        help="--kind sparse: exact (posting lists accumulated, default) or seismic (Seismic's "
        "approximate candidates, rescored exactly)",
    )
    dense_build = build.get_default("func")

    def run(args: argparse.Namespace) -> int:
        from ..index.collection import is_collection

        if args.kind is None and is_collection(Path(args.out)):
            args.kind = "dense"  # a folder of kinds: the dense build adds its dense kind
        return run_kind_build(args) if args.kind is not None else dense_build(args)

    build.set_defaults(func=run)
    info = actions.choices["info"]
    dense_info = info.get_default("func")

    def describe(args: argparse.Namespace) -> int:
        from ..index.collection import is_collection

        return run_kind_info(args) if is_collection(Path(args.index)) else dense_info(args)

    info.set_defaults(func=describe)
    _register_add(actions.choices["add"])


def _register_add(add: argparse.ArgumentParser) -> None:
    """Send ``index add`` on a folder of kinds to ``index_kinds_add``, with its model flags."""
    from .index_kinds_add import add_kind_model_arguments

    add_kind_model_arguments(add)
    add.description += (
        " On a folder of kinds, the texts go to its texts store and to every kind it holds, "
        "each encoded by its own model (--model, --sparse-model, --multivector-model; by "
        "default the one it records; bm25 needs none)."
    )
    dense_add = add.get_default("func")

    def run(args: argparse.Namespace) -> int:
        from ..index.collection import is_collection
        from .index_kinds_add import refuse_kind_model_flags, run_kind_add

        if is_collection(Path(args.index)):
            return run_kind_add(args)
        refuse_kind_model_flags(args)
        return dense_add(args)

    add.set_defaults(func=run)


def run_kind_info(args: argparse.Namespace) -> int:
    """``index info`` of a folder of kinds: its texts, then each kind's model and files."""
    from ..index import open_kind_index
    from ..index.collection import kinds_present, open_texts

    path = Path(args.index)
    _, record = open_texts(path)
    # Every kind opened before a line is printed: a damaged one is the only line.
    indexes = {kind: open_kind_index(path, kind) for kind in kinds_present(path)}
    print(f"index       {path}: {record['rows']:,} texts, kinds {', '.join(indexes)}")
    for kind, index in indexes.items():
        model = "no model" if index.identity is None else index.identity.describe()
        print(f"{kind:<11} {index.generation}, {index.rows:,} rows, {model}")
    return 0


def _held_texts(out: Path, args: argparse.Namespace) -> tuple[list[str], list[str], dict]:
    """(texts, ids, source) of the texts a folder of kinds holds: a kind built without
    ``--corpus`` is built over them (after adds, no single corpus file holds them all)."""
    from ..cli import CliError
    from ..index.collection import open_texts
    from ..index.texts_repair import held_texts, record_damaged

    for flag in ("field", "id_field"):
        if getattr(args, flag) is not None:
            raise CliError(f"--{flag.replace('_', '-')} applies with --corpus FILE")
    if not (out / "texts").is_dir():
        raise CliError(
            f"--corpus FILE is required: {out} holds no texts yet (a kind is built without "
            "--corpus only over the texts a folder of kinds already holds)"
        )
    if record_damaged(out):  # the build writes the record again from these (texts_repair)
        try:
            ids, texts = held_texts(out)
        except ValueError as exc:
            raise CliError(f"--corpus FILE is required: {exc}") from None
    else:
        store, record = open_texts(out)
        ids, texts = store.all(record["rows"])
    return texts, ids, {"texts": str(out / "texts"), "rows": len(texts)}


def run_kind_build(args: argparse.Namespace) -> int:
    from ..index import build_index
    from ..index.collection import is_collection, kinds_present
    from .index import _Chunks, _encode_options, _status, _writing, read_corpus_file

    kind = args.kind
    options = _kind_options(args)
    out = _check_destination(args.out)
    if args.corpus is None:
        texts, ids, source = _held_texts(out, args)
    else:
        texts, ids, source = read_corpus_file(args)
    _check_held_texts(out, texts, ids)
    encoder = _kind_model(args, kind)
    chunks = _Chunks()
    status = _status("build", args)
    keywords = {"on_chunk": chunks, "ids": ids, "options": options}
    if kind == "dense":
        keywords.update(_encode_options(args, status), source=source)
        keywords["graph_progress"] = status.progress("inserting into the graph", "vectors")
    elif kind != "bm25":
        keywords["progress"] = status.progress("encoding", "texts") or None
        keywords["batch_size"] = args.batch_size
    before = is_collection(out) and kind in kinds_present(out)
    index = _writing(lambda: build_index(out, texts, encoder, kind=kind, **keywords), status, args)
    resumed = f", {chunks.reused} chunk(s) reused" if chunks.reused else ""
    encoded = "" if kind == "bm25" else f" ({chunks.encoded} chunk(s) encoded{resumed})"
    verb = "rebuilt" if before else "built"
    print(
        f"{verb} the {kind} index of {out}: {index.rows:,} texts{encoded}; {out} holds "
        f"{', '.join(kinds_present(out))}",
        file=sys.stderr,
    )
    return 0


def _check_held_texts(out: Path, texts: list[str], ids: list[str]) -> None:
    """Refused before a model is loaded or a text encoded: texts other than the folder holds.
    A damaged record is no refusal where the build writes it again (texts_repair)."""
    from ..cli import CliError
    from ..index.collection import _read_texts_record, content_hash, kinds_present
    from ..index.texts_repair import record_damaged, repair_plan

    if not (out / "texts").is_dir():
        return
    if record_damaged(out):
        try:
            repair_plan(out, texts, ids)
        except ValueError as exc:
            raise CliError(f"--corpus: {exc}") from None
        return
    held = _read_texts_record(out / "texts")
    if held["content"] != content_hash(texts, ids):
        raise CliError(
            f"--corpus: {out} holds an index of other texts ({held['rows']:,} rows, kinds "
            f"{', '.join(kinds_present(out)) or 'none'}); give the same corpus, or build "
            "into another folder"
        )


def _kind_options(args: argparse.Namespace):
    """The kind's options from the flags; a dense-only flag given to another kind is refused."""
    from ..cli import CliError
    from ..index import BM25Options, IndexOptions, MultiVectorOptions, SparseOptions
    from .search_kinds import refuse_model_flags

    kind = args.kind
    if kind != "dense":
        for flag, given in (
            ("--storage", args.storage != "float32"),
            ("--dimensions", args.dimensions is not None),
        ):
            if given:
                raise CliError(f"{flag} applies to --kind dense, not --kind {kind}")
    if kind != "sparse" and args.engine is not None:
        raise CliError(f"--engine applies to --kind sparse, not --kind {kind}")
    if kind in ("bm25", "sparse") and args.ann != "auto":
        raise CliError(f"--ann applies to --kind dense or multivector, not --kind {kind}")
    if kind == "bm25":
        refuse_model_flags(args, "--kind bm25")
    try:
        if kind == "dense":
            return IndexOptions(
                storage=args.storage, dimensions=args.dimensions, ann=args.ann,
                chunk_rows=args.chunk_rows,
            )  # fmt: skip
        if kind == "sparse":
            return SparseOptions(chunk_rows=args.chunk_rows, engine=args.engine or "exact")
        if kind == "multivector":
            return MultiVectorOptions(ann=args.ann, chunk_rows=args.chunk_rows)
        return BM25Options()
    except ValueError as exc:
        raise CliError(f"--{str(exc).replace('_', '-')}") from None


def _check_destination(value: str) -> Path:
    from ..cli import CliError
    from ..index.collection import holds_only_leftovers, is_collection

    path = Path(value)
    if path.exists() and not path.is_dir():
        raise CliError(f"--out: {path} is a file, expected an index folder")
    if path.is_dir() and not holds_only_leftovers(path) and not is_collection(path):
        if (path / "CURRENT").exists() or (path / "generations").is_dir():
            raise CliError(
                f"--out: {path} is a dense index built without --kind; build kinds into a new "
                "folder (or rebuild it without --kind)"
            )
        raise CliError(f"--out: {path} is a directory that holds no index; give a new or empty one")
    if not path.parent.is_dir():
        raise CliError(f"--out: the folder {path.parent} does not exist")
    return path


def _kind_model(args: argparse.Namespace, kind: str):
    """The model of a ``kind`` build: none for bm25, the checkpoint's kind checked first."""
    from ..cli import CliError
    from .encode import load_encoder
    from .kind_models import check_model_kind, is_bge_m3, load_model

    if kind == "bm25":
        if args.model is not None:
            raise CliError("--model: a bm25 index uses no model (its terms are the texts' words)")
        return None
    if args.model is None and kind != "dense":
        raise CliError(f"--model: a {kind} index needs a {kind} model; none ships with clearformer")
    if args.model is not None:
        if not Path(args.model).is_dir():
            raise CliError(f"--model {args.model}: no such directory")
        check_model_kind(kind, args.model, "--model")
    if kind == "dense" and (args.model is None or not is_bge_m3(args.model)):
        return load_encoder(args, hold_precision=True)
    # bge-m3 for a dense kind too: the build takes its dense view (index.kinds.encoder_for)
    return load_model(kind, args.model, precision=args.precision, device=args.device)
