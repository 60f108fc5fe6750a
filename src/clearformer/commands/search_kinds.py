"""``clearformer search QUERY --index INDEX --mode MODE``: search a folder of kinds by one kind
(dense, sparse, multivector, bm25) or by several fused (``hybrid``: ``--fusion rrf`` or
``weighted``). Each kind's query is encoded by that kind's own model (by default the one the
index records; ``--model``, ``--sparse-model``, ``--multivector-model`` name it, and the index
refuses another). Output as ``search --index``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

MODES = ("dense", "sparse", "multivector", "bm25", "hybrid")
FUSIONS = ("rrf", "weighted")
NORMALIZATIONS = ("minmax", "zscore")
DEPTH_DEFAULT = 100  # --depth: texts each kind retrieves before fusion
RRF_K_DEFAULT = 60  # --rrf-k: reciprocal rank fusion's constant


def add_kind_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--mode",
        choices=MODES,
        default=None,
        help="with --index: the kind to search, or hybrid (several fused); default: the "
        "index's only kind, or hybrid over all its kinds",
    )
    add_fusion_arguments(p)
    p.add_argument(
        "--depth",
        type=int,
        default=DEPTH_DEFAULT,
        metavar="N",
        help="--mode hybrid: texts each kind retrieves before fusion, at least -k (default 100)",
    )
    p.add_argument(
        "--candidates",
        type=int,
        default=None,
        metavar="N",
        help="multivector (and a sparse index with engine seismic): candidates rescored "
        "exactly per query (default: the index's, 200 and 100)",
    )
    p.add_argument(
        "--sparse-model", metavar="DIR", help="the sparse index's model (default: recorded)"
    )
    p.add_argument(
        "--multivector-model",
        metavar="DIR",
        help="the multi-vector index's model (default: recorded)",
    )


def add_fusion_arguments(p: argparse.ArgumentParser) -> None:
    """--kinds, --fusion, --rrf-k, --weights, --normalization (search and eval)."""
    p.add_argument(
        "--kinds",
        metavar="K1,K2",
        default=None,
        help="--mode hybrid: the kinds to fuse, comma-separated (default: every kind held)",
    )
    p.add_argument(
        "--fusion",
        choices=FUSIONS,
        default=None,
        help="--mode hybrid: rrf (reciprocal rank fusion, default) or weighted (normalised "
        "scores, weighted per kind)",
    )
    p.add_argument(
        "--rrf-k",
        type=int,
        default=RRF_K_DEFAULT,
        metavar="K",
        help="--fusion rrf: the constant in 1 / (K + rank) (default 60)",
    )
    p.add_argument(
        "--weights",
        metavar="KIND=W,...",
        default=None,
        help="--fusion weighted: per-kind weights, e.g. dense=1,bm25=0.5 (default 1 each)",
    )
    p.add_argument(
        "--normalization",
        choices=NORMALIZATIONS,
        default=None,
        help="--fusion weighted: each kind's scores as min-max (default) or z-scores",
    )


def refuse_kind_flags(args: argparse.Namespace, *, corpus: bool = False) -> None:
    """A plain dense index (or, with ``corpus``, a ``--corpus`` search) takes none of the
    hybrid flags: each would be unused in silence. ``--depth`` and ``--rrf-k`` count as given
    when they differ from their defaults."""
    from ..cli import CliError

    for flag, given in (
        ("--candidates", getattr(args, "candidates", None) is not None),
        ("--kinds", args.kinds is not None),
        ("--fusion", args.fusion is not None),
        ("--rrf-k", args.rrf_k != RRF_K_DEFAULT),
        ("--weights", args.weights is not None),
        ("--normalization", args.normalization is not None),
        ("--depth", getattr(args, "depth", DEPTH_DEFAULT) != DEPTH_DEFAULT),
        ("--sparse-model", args.sparse_model is not None),
        ("--multivector-model", args.multivector_model is not None),
    ):
        if given:
            if corpus:
                raise CliError(f"{flag} applies to --index, not a --corpus search")
            hybrid = ("--kinds", "--fusion", "--rrf-k", "--weights", "--normalization", "--depth")
            where = "--mode hybrid" if flag in hybrid else "an index folder of several kinds"
            raise CliError(f"{flag} applies to {where}, not this search")


def refuse_unsearched_models(args: argparse.Namespace, mode: str, kinds: list[str]) -> None:
    """A model flag for a kind this search does not search would be silently unused."""
    from ..cli import CliError

    searched = f"--mode {mode}" + (f" (fusing {','.join(kinds)})" if mode == "hybrid" else "")
    for flag, kind in (
        ("--model", "dense"),
        ("--sparse-model", "sparse"),
        ("--multivector-model", "multivector"),
    ):
        if getattr(args, flag[2:].replace("-", "_")) is not None and kind not in kinds:
            raise CliError(
                f"{flag} applies to the {kind} kind (--mode {kind}, or --mode hybrid with "
                f"{kind} among --kinds), not this search: {searched}"
            )


def fusion_from(args: argparse.Namespace, kinds: list[str]):
    """The Fusion the flags describe, every flag checked against the method and the kinds."""
    from ..cli import CliError
    from ..index import Fusion

    method = args.fusion or "rrf"
    if method == "rrf" and (args.weights is not None or args.normalization is not None):
        raise CliError("--weights and --normalization apply to --fusion weighted, not rrf")
    weights: dict[str, float] = {}
    for item in (args.weights or "").split(","):
        if not item.strip():
            continue
        kind, _, value = item.partition("=")
        kind = kind.strip()
        try:
            weights[kind] = float(value)
        except ValueError:
            raise CliError(f"--weights: expected KIND=NUMBER, got {item!r}") from None
        if kind not in kinds:
            raise CliError(f"--weights: {kind!r} is not a fused kind (fusing {', '.join(kinds)})")
        if not math.isfinite(weights[kind]) or weights[kind] < 0:
            raise CliError(f"--weights: {kind}'s weight must be a finite number >= 0, got {value}")
    if args.rrf_k < 0:
        raise CliError(f"--rrf-k must be an integer >= 0, got {args.rrf_k}")
    try:
        return Fusion(
            method, k=args.rrf_k, weights=weights, normalization=args.normalization or "minmax"
        )
    except ValueError as exc:
        raise CliError(f"--fusion: {exc}") from None


def run_kind_search(args: argparse.Namespace, path: Path) -> int:
    from ..checks import check_unicode
    from ..cli import CliError
    from ..index import HybridIndex
    from ..index.collection import kinds_present
    from .search import shorten

    if path.exists() and not path.is_dir():
        raise CliError(f"INDEX {path} is a file, not an index folder (`clearformer index build`)")
    if not path.is_dir():
        raise CliError(f"INDEX {path} does not exist: build it with `clearformer index build`")
    present = kinds_present(path)
    if not present:
        raise CliError(f"INDEX {path} holds no committed index of any kind: build one first")
    mode = args.mode or ("hybrid" if len(present) > 1 else present[0])
    kinds = [mode] if mode != "hybrid" else present
    if args.kinds is not None:
        if mode != "hybrid":
            raise CliError("--kinds applies to --mode hybrid")
        kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
        if not kinds:
            raise CliError(
                f"--kinds: expected kinds separated by commas (of {', '.join(present)}), got "
                f"{args.kinds!r}"
            )
    missing = [k for k in kinds if k not in present]
    if missing:
        flag = "--kinds" if args.kinds is not None else f"--mode {mode}"
        raise CliError(
            f"{flag}: {path} holds no {', '.join(missing)} index (it holds {', '.join(present)})"
        )
    refuse_unsearched_models(args, mode, kinds)
    if mode != "hybrid":
        refuse_kind_flags(argparse.Namespace(**{**vars(args), "sparse_model": None,
                                                "multivector_model": None,
                                                "candidates": None}))  # fmt: skip
    fusion = fusion_from(args, kinds) if mode == "hybrid" else None
    if args.depth <= 0:
        raise CliError(f"--depth must be a positive integer, got {args.depth}")
    if kinds == ["bm25"]:
        refuse_model_flags(args, "--mode bm25" if mode == "bm25" else "--kinds bm25")
    settings = _candidates(args, path, kinds)
    if not args.query.strip():
        raise CliError("QUERY is empty")
    check_unicode(args.query, "QUERY")
    models = {kind: _model(args, path, kind) for kind in kinds if kind != "bm25"}
    index = HybridIndex.open(path, models, kinds=kinds)
    hits = index.search(
        args.query, k=args.top_k, mode=mode, kinds=kinds if mode == "hybrid" else None,
        fusion=fusion, depth=args.depth, settings=settings,
    )  # fmt: skip
    if not hits:  # on stderr: stdout stays the (empty) list of results
        why = ""
        if "bm25" in kinds:
            why = " (BM25 finds texts sharing a word with it, stop words aside)"
        print(f"clearformer search: no text matches the query{why}", file=sys.stderr)
    for rank, hit in enumerate(hits, start=1):
        if args.json:
            item = {"rank": rank, "score": round(hit.score, 6), "id": hit.id, "text": hit.text}
            print(json.dumps(item, ensure_ascii=False))
        else:
            print(f"{rank:>3}  {hit.score:.4f}  {hit.id}: {shorten(hit.text, args.width)}")
    sys.stdout.flush()
    return 0


def refuse_model_flags(args: argparse.Namespace, where: str) -> None:
    """BM25 runs no model: a model's flags (``where`` names the search, build or add that
    uses none) would be unused in silence. ``--precision`` counts as given when it is not
    the default (float32, or none where an add holds the index's)."""
    from ..cli import CliError

    for flag, given in (
        (f"--precision {args.precision}", args.precision not in (None, "float32")),
        ("--batch-size", args.batch_size is not None),
        ("--max-tokens", args.max_tokens is not None),
        ("--workers", args.workers is not None),
        (f"--device {args.device}", args.device is not None),
        (f"--backend {args.backend}", args.backend != "auto"),
    ):
        if given:
            raise CliError(f"{flag} applies to a model; {where} uses none (BM25 scores words)")


def _candidates(args: argparse.Namespace, path: Path, kinds: list[str]) -> dict:
    """``--candidates`` as the settings of the kinds that take it: multivector, and sparse
    with the seismic engine (the exact engine scores every posting list: no candidates)."""
    from ..cli import CliError

    if args.candidates is None:
        return {}
    if args.candidates <= 0:
        raise CliError(f"--candidates must be a positive integer, got {args.candidates}")
    approximate = [k for k in kinds if k == "multivector"]
    engine = _recorded_engine(path) if "sparse" in kinds else None
    if engine == "seismic":
        approximate.append("sparse")
    if not approximate and engine is not None:
        raise CliError(
            f"--candidates applies to multivector or a sparse index of engine seismic; the "
            f"sparse index of {path} is of engine {engine}, which scores every text (no "
            "candidates)"
        )
    if not approximate:
        raise CliError(f"--candidates applies to multivector or sparse, not {', '.join(kinds)}")
    return {kind: {"candidates": args.candidates} for kind in approximate}


def _model(args: argparse.Namespace, path: Path, kind: str):
    """The query model of ``kind``: its flag, else the model the sub-index records."""
    from ..cli import CliError
    from .kind_models import check_model_kind, load_model

    if kind == "dense":
        return _dense_model(args, path)
    flag = f"--{kind}-model"
    given = getattr(args, f"{kind}_model")
    if given is None:
        given = _recorded_model(path, kind)
        if not given or not Path(given).is_dir():
            raise CliError(
                f"{flag}: the {kind} index's model ({given or 'not recorded'}) is not there; "
                f"give {flag} DIR"
            )
    elif not Path(given).is_dir():
        raise CliError(f"{flag} {given}: no such directory")
    check_model_kind(kind, given, flag)  # a model of another kind: refused naming this flag
    # index add holds its --precision alone (by default the one the kind holds its embeddings
    # in); search its --precision for the queries (float32 unless given).
    held = args.precision
    if getattr(args, "hold_precision", False):
        held = args.precision or _recorded_precision(path, kind)
    return load_model(kind, given, precision=held, device=getattr(args, "device", None))


def _dense_model(args: argparse.Namespace, path: Path, hold: bool = True):
    """The dense kind's model: ``--model``, else the one the dense index records (else the
    bundled one). A bge-m3 checkpoint is loaded as bge-m3 (the index takes its dense view),
    held in --precision, else in the precision the index holds its vectors in."""
    from ..index.collection import is_collection
    from .index import index_encoder
    from .kind_models import is_bge_m3, load_model

    dense = path / "dense" if is_collection(path) else path
    route = _kind_model_flag if dense != path else None  # a folder of kinds: a flag per kind
    recorded = _dense_record(dense) if args.model is None or is_bge_m3(args.model) else {}
    given = args.model or recorded.get("path")
    if given is None or not is_bge_m3(given):
        # search holds --precision for its queries, as index add holds it for its texts
        return index_encoder(args, dense, hold=hold, route=route)
    held = args.precision
    if hold and held is None:
        held = recorded.get("precision")
    return load_model("dense", given, precision=held, device=getattr(args, "device", None))


def _kind_model_flag(kind: str) -> str:
    """What a folder of kinds says of a ``--model`` of another ``kind``: its own flag."""
    return f"--model is the dense kind's model: give it as --{kind}-model"


def _dense_record(dense: Path) -> dict:
    """What the committed dense index at ``dense`` records of its model: ``path`` and
    ``precision`` where its ``meta.json`` says (opening the index for the search checks it
    whole, and says what is wrong)."""
    from ..index import layout
    from ..index.recipe import index_precision

    try:
        generation = layout.current_generation(dense)
        meta = layout.read_json(layout.generation_dir(dense, generation or "") / layout.META)
        path, precision = meta["model"]["path"], index_precision(meta)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}
    found = {"precision": precision} if precision != "mixed" else {}
    return {**found, "path": path} if isinstance(path, str) and path else found


def _recorded_precision(path: Path, kind: str) -> str:
    from ..index.kind_store import open_kind

    _, meta = open_kind(path, kind)
    return meta.get("precision", "float32")


def _recorded_engine(path: Path) -> str:
    """The engine of the sparse index of ``path``: exact (as before engines), or seismic."""
    from ..index.kind_store import open_kind

    _, meta = open_kind(path, "sparse")
    return meta["options"].get("engine", "exact")


def _recorded_model(path: Path, kind: str) -> str:
    from ..index.kind_store import open_kind

    _, meta = open_kind(path, kind)
    return (meta.get("model") or {}).get("path", "")
