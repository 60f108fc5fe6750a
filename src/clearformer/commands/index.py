"""``clearformer index build | add | info``: a persistent vector index of a corpus.

``build`` embeds a corpus file into an index directory; ``add`` embeds more texts into it
(exactly once: the same add run again, after a kill or after it committed, adds nothing);
``info`` prints what an index holds
and its size. ``clearformer search QUERY --index INDEX`` searches it. A killed build or add
leaves the previous index as it was; the same command again resumes from the chunks of
embeddings it committed. See ``docs/index.md``.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from pathlib import Path

from .encode import (
    ENCODE_PRECISIONS,
    add_model_arguments,
    add_precision_argument,
    batching_options,
    positive_int,
)

STORAGES = ("float32", "int8", "binary")  # as clearformer.index.options, without importing it
ANN_MODES = ("auto", "hnsw", "exact")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "index",
        help="build, extend or describe a vector index of a corpus",
        description="A persistent vector index of a corpus: build it, add to it, describe it. "
        "Search it with `clearformer search QUERY --index INDEX`.",
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True

    build = actions.add_parser(
        "build",
        help="embed a corpus file into a new index",
        description="Embed every text of a corpus file and write an index of them to INDEX: "
        "the vectors (float32, int8 or binary), the texts and their ids, and the model that "
        "made them. A killed build resumes from its committed chunks when run again; the "
        "same build over a damaged index writes its damaged files anew. Progress and each "
        "phase (embedding, graph, commit) go to stderr.",
    )
    _corpus_arguments(build, required=False)
    build.add_argument("--out", required=True, metavar="INDEX", help="the index directory")
    build.add_argument(
        "--storage",
        choices=STORAGES,
        default="float32",
        help="vectors held in memory for search: float32, int8 (4x smaller) or binary (32x "
        "smaller); candidates are rescored with float32 vectors kept on disk (default float32)",
    )
    build.add_argument(
        "--dimensions",
        type=positive_int,
        default=None,
        metavar="N",
        help="keep the first N dimensions of each embedding, renormalised (Matryoshka "
        "truncation; default: all)",
    )
    build.add_argument(
        "--ann",
        choices=ANN_MODES,
        default="auto",
        help="hnsw: a graph (approximate); exact: a full scan; auto: exact up to 20,000 "
        "vectors, else hnsw (default auto)",
    )
    build.add_argument(
        "--chunk-rows",
        type=positive_int,
        default=4096,
        metavar="N",
        help="texts embedded per committed chunk: what a killed build resumes from (default 4096)",
    )
    add_model_arguments(build)
    _precision_argument(build)
    build.set_defaults(func=run_build)

    add = actions.add_parser(
        "add",
        help="embed more texts into an index (exactly once)",
        description="Embed the texts of a corpus file into an existing index, with the "
        "index's own model, storage and dimensions. Exactly once per add: the same texts (and "
        "ids) added again, after a kill or after the add committed, add nothing, and a killed "
        "add resumes from its committed chunks. A file that holds those texts and more is "
        "another add: all its texts are added.",
    )
    add.add_argument("index", metavar="INDEX", help="the index directory")
    _corpus_arguments(add)
    add_model_arguments(add)
    _precision_argument(add, default="the precision the index was built in")
    add.set_defaults(func=run_add)

    info = actions.add_parser(
        "info",
        help="what an index holds, and its size",
        description="The model, rows, segments, storage and search of an index, and its "
        "memory and disk per vector. Every file of the index is checked on the way.",
    )
    info.add_argument("index", metavar="INDEX", help="the index directory")
    info.set_defaults(func=run_info)


def _precision_argument(p: argparse.ArgumentParser, default: str | None = None) -> None:
    """``--precision`` of the models that embed the texts, each loaded in it alone;
    ``default``: what an omitted flag means where it is not float32 (``index add``: the
    precision the index holds)."""
    add_precision_argument(
        p,
        ENCODE_PRECISIONS,
        "the precision the texts are embedded in, the model loaded in it alone (sparse and "
        "multi-vector models: float32 or bf16); bf16: bfloat16 matrix products, embeddings "
        "within cosine 0.995 of float32; int8 (dense models): int8 matrix products, within "
        "cosine 0.99; int8-blocks (dense models): int8 weights scaled per block of 32, closer "
        "to float32 than int8",
    )
    p.set_defaults(hold_precision=True)
    if default is not None:
        p.set_defaults(precision=None)
        for action in p._actions:
            if action.dest == "precision":
                action.help = action.help.replace("default float32", f"default: {default}")


def _corpus_arguments(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    helped = "one text per line, or JSONL with --field"
    if not required:  # build: a folder of kinds already holds its texts
        helped += "; a folder of kinds that holds texts: omit it to build a kind over them"
    p.add_argument("--corpus", required=required, metavar="FILE", help=helped)
    p.add_argument("--field", metavar="NAME", help="JSONL corpus: the text field (default: text)")
    p.add_argument(
        "--id-field",
        metavar="NAME",
        help="JSONL corpus: the field holding each text's id (default: FILE:LINE)",
    )


def read_corpus_file(args: argparse.Namespace) -> tuple[list[str], list[str], dict]:
    """(texts, ids, source) of ``--corpus``: blank texts left out, each id the ``--id-field``
    or ``FILE:LINE``; source records the file's name and SHA-256."""
    import hashlib

    from ..checks import check_unicode
    from ..cli import CliError
    from ..io import parse_json_object, read_lines, read_texts
    from .inputs import is_jsonl, require_input_file

    if args.corpus is None:
        raise CliError("--corpus FILE is required: the texts to index")
    path = require_input_file(args.corpus, "--corpus")
    data = path.read_bytes()
    jsonl = args.field is not None or args.id_field is not None or is_jsonl(path)
    if not jsonl:
        entries = [(f"{path.name}:{n}", t) for n, t in enumerate(read_texts(data, str(path)), 1)]
    else:
        field = args.field or "text"
        entries = []
        for number, line in enumerate(read_lines(data, str(path)), start=1):
            if not line.strip():
                continue
            item = parse_json_object(line, f"{path} line {number}")
            text = item.get(field)
            if not isinstance(text, str):
                raise CliError(f"{path} line {number}: expected a string field {field!r}")
            check_unicode(text, f"{path} line {number}: field {field!r}")
            ident = f"{path.name}:{number}"
            if args.id_field is not None:
                if args.id_field not in item:
                    raise CliError(f"{path} line {number}: no id field {args.id_field!r}")
                ident = str(item[args.id_field])
            entries.append((ident, text))
    entries = [(ident, text) for ident, text in entries if text.strip()]
    if not entries:
        raise CliError(f"empty input: {path} holds no non-blank texts")
    source = {"file": str(path), "sha256": hashlib.sha256(data).hexdigest()}
    return [t for _, t in entries], [i for i, _ in entries], source


def check_index_destination(value: str) -> Path:
    """--out INDEX: a new directory, or one that already holds an index (rebuilt)."""
    from ..cli import CliError
    from .outputs import check_destination

    path = Path(value)
    if path.exists() and not path.is_dir():
        raise CliError(f"--out: {path} is a file, expected an index directory")
    marks = ("CURRENT", "staging", "generations")
    if path.is_dir() and any(path.iterdir()) and not any((path / m).exists() for m in marks):
        raise CliError(f"--out: {path} is a directory that holds no index; give a new or empty one")
    # A file can be written where the index goes: in it (a rebuild) or beside it (a new one).
    check_destination("--out", path / "CURRENT" if path.is_dir() else path)
    return path


def index_encoder(
    args: argparse.Namespace,
    index_path: Path,
    *,
    hold: bool | None = None,
    route: Callable[[str], str] | None = None,
):
    """The model to embed with: --model, else the model the index records (if that
    directory still exists), else the bundled one. The index refuses any other model.
    ``hold``: load it in --precision alone (None: as the command's ``hold_precision`` says).
    A --model of another kind is refused naming ``route(kind)`` (default: a dense index's
    own model, :func:`dense_index_route`)."""
    from ..index import IndexNotFoundError, VectorIndex
    from ..index.recipe import index_precision
    from ..text import TextEncoder
    from .encode import device_flag
    from .kind_models import refuse_other_kind

    model = args.model
    refuse_other_kind(model, route or functools.partial(dense_index_route, args, index_path))
    # index add holds its --precision alone (by default the one the index was built in);
    # search encodes its queries per call.
    if hold is None:
        hold = getattr(args, "hold_precision", False)
    held = args.precision if hold else None
    opened = None
    if model is None or (hold and held is None):  # the index's record is needed: open it
        try:
            opened = VectorIndex.open(index_path)
        except (IndexNotFoundError, OSError, ValueError, KeyError):
            opened = None
    if model is None:
        recorded = "" if opened is None else opened.identity.path
        model = recorded if recorded and Path(recorded).is_dir() else None
    if hold and held is None and opened is not None and index_precision(opened.meta) != "mixed":
        held = index_precision(opened.meta)
    return TextEncoder.from_pretrained(
        model, backend=args.backend, precision=held, device=device_flag(args)
    )


def dense_index_route(args: argparse.Namespace, index_path: Path, kind: str) -> str:
    """What a search of, or an add to, the dense index at ``index_path`` says of a --model of
    another ``kind``: the index embeds with its own dense model; that kind has its own."""
    from .kind_models import kind_flag

    verb = "searched" if args.command == "search" else "embedded"
    return (
        f"{index_path} is a dense index, {verb} with its own dense model (omit --model); a "
        f"{kind} model needs an index built with `clearformer index build {kind_flag(kind)}`"
    )


def build_route(kind: str) -> str:
    """What ``index build`` without ``--kind`` (a dense index) says of a ``kind`` model."""
    if kind == "bge-m3":
        return "build its dense view with --kind dense (or its --kind sparse or multivector)"
    return f"build its index with --kind {kind}"


def _encode_options(args: argparse.Namespace, status) -> dict:
    return {**batching_options(args), "progress": status.progress("embedding", "texts") or False}


def _status(verb: str, args: argparse.Namespace):
    """Phase lines and progress on stderr: ``--progress`` redraws one line even off a
    terminal, ``--no-progress`` keeps only the phase lines."""
    from .status_line import StatusLine

    redraw = True if args.progress else None
    return StatusLine(f"index {verb}", redraw=redraw, show_progress=args.progress is not False)


class _Chunks:
    """Counts the chunks a write encoded and the ones it reused."""

    def __init__(self) -> None:
        self.encoded = self.reused = 0

    def __call__(self, index: int, reused: bool) -> None:
        if reused:
            self.reused += 1
        else:
            self.encoded += 1


def run_build(args: argparse.Namespace) -> int:
    from ..cli import CliError
    from ..index import IndexOptions, build_index
    from .encode import device_flag

    device_flag(args)  # before the corpus is read

    try:
        options = IndexOptions(
            storage=args.storage,
            dimensions=args.dimensions,
            ann=args.ann,
            chunk_rows=args.chunk_rows,
        )
    except ValueError as exc:
        raise CliError(f"--{str(exc).replace('_', '-')}") from None
    out = check_index_destination(args.out)
    texts, ids, source = read_corpus_file(args)
    _require_engine()
    encoder = _load(args)
    before = _generation(out)
    chunks = _Chunks()
    status = _status("build", args)
    index = _writing(
        lambda: build_index(
            out,
            texts,
            encoder,
            ids=ids,
            options=options,
            source=source,
            on_chunk=chunks,
            graph_progress=status.progress("inserting into the graph", "vectors"),
            **_encode_options(args, status),
        ),
        status,
        args,
    )
    _report(out, index, before, chunks, building=True)
    return 0


def run_add(args: argparse.Namespace) -> int:
    from ..index import add_to_index
    from .encode import device_flag

    path = Path(args.index)
    _require_index(path)
    device_flag(args)  # before the corpus is read
    texts, ids, source = read_corpus_file(args)
    _require_engine()
    encoder = index_encoder(args, path)
    before = _generation(path)
    chunks = _Chunks()
    status = _status("add", args)
    index = _writing(
        lambda: add_to_index(
            path,
            texts,
            encoder,
            ids=ids,
            source=source,
            on_chunk=chunks,
            graph_progress=status.progress("inserting into the graph", "vectors"),
            **_encode_options(args, status),
        ),
        status,
        args,
    )
    _report(path, index, before, chunks, building=False)
    return 0


def run_info(args: argparse.Namespace) -> int:
    from ..index import VectorIndex

    path = Path(args.index)
    _require_index(path)
    _require_engine()
    index = VectorIndex.open(path)
    stats = index.stats()
    model = index.identity
    print(f"index       {path} ({index.generation})")
    print(f"model       {model.describe()}")
    print(f"            revision {model.revision}, from {model.path}")
    print(f"rows        {index.rows:,} in {len(index.meta['segments'])} segment(s)")
    print(f"vectors     {index.dimensions} dimensions, {stats.storage}, search: {stats.ann}")
    print(f"memory      {stats.memory_per_vector:,.1f} bytes per vector ({stats.memory_bytes:,})")
    print(f"disk        {stats.disk_per_vector:,.1f} bytes per vector ({stats.disk_bytes:,})")
    return 0


def _load(args: argparse.Namespace):
    from .encode import load_encoder

    return load_encoder(args, hold_precision=True, route=build_route)


def _require_engine() -> None:
    from ..cli import CliError
    from ..index.engine import MissingEngineError, usearch_index_module

    try:
        usearch_index_module()
    except MissingEngineError as exc:
        raise CliError(str(exc)) from None


def _require_index(path: Path) -> None:
    from ..cli import CliError
    from ..index import layout

    if path.exists() and not path.is_dir():
        raise CliError(f"INDEX {path} is a file, not an index folder (`clearformer index build`)")
    if not path.is_dir():
        raise CliError(f"INDEX {path} does not exist: build it with `clearformer index build`")
    if layout.current_generation(path) is None:
        raise CliError(
            f"INDEX {path} holds no committed index: {path / layout.CURRENT} is missing or "
            "empty (a build stopped before its commit leaves none): run the same build again "
            "to resume it, or to rebuild the index"
        )


def _generation(path: Path) -> str | None:
    """The committed generation before a write (None: none, or a damaged ``CURRENT``, which a
    build replaces)."""
    from ..index import layout

    try:
        return layout.current_generation(path) if path.is_dir() else None
    except layout.IndexDamagedError:
        return None


def _writing(write, status, args: argparse.Namespace):
    """Run a build or add with its phases on stderr, and a busy index as a one-line error."""
    from ..cli import CliError
    from ..index.layout import IndexBusyError
    from .status_line import phases_from

    try:
        with phases_from("clearformer.index", status, args.verbose):
            return write()
    except IndexBusyError as exc:
        raise CliError(str(exc)) from None


def _report(path: Path, index, before: str | None, chunks: _Chunks, building: bool) -> None:
    """What a build or add did: the vectors it wrote (a build) or added (an add: its segment,
    the last), and what the index holds now."""
    stats = index.stats()
    if index.generation == before:
        return  # the write's own line says so: the index already holds these texts
    resumed = f", {chunks.reused} chunk(s) reused" if chunks.reused else ""
    holds = (
        f"{index.rows:,} vectors of {index.dimensions} dimensions, {stats.storage}, "
        f"{stats.ann} search ({chunks.encoded} chunk(s) encoded{resumed}); memory "
        f"{stats.memory_per_vector:,.0f} B/vector, disk {stats.disk_per_vector:,.0f} B/vector"
    )
    if building:
        print(f"built {path}: {holds}", file=sys.stderr)
    else:
        added = index.meta["segments"][-1]["rows"]
        print(f"added {added:,} vectors to {path}: it holds {holds}", file=sys.stderr)
