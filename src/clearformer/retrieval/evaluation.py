"""``evaluate``: how well an embedding model (and the search path in front of it) retrieves a
benchmark's relevant documents.

It runs the real search path a user would run: the corpus embedded at the chosen precision and
width, searched exactly or through a persistent index (float32 / int8 / binary storage, graph or
scan), optionally reranked by a cross-encoder, and scores the run as trec_eval does
(:mod:`.metrics`). So a speed option shows its cost in NDCG, not only in recall against exact
search.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..options import RERANK_FUSIONS
from ..precision.names import CROSS_ENCODER_PRECISIONS, check_precision
from ..text.prompts import side_prompt_options
from ..version import __version__
from .beir import RetrievalData
from .metrics import DEFAULT_MEASURES, evaluate_run, mean_measures, parse_measure
from .stages import Run, exact_run, index_run, rerank_run

log = logging.getLogger(__name__)

# (phase, done, total): "corpus" and "queries" count texts, "rerank" counts pairs.
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class EvalSettings:
    """What is evaluated besides the model: precision, width, search path and reranking."""

    precision: str = (
        "float32"  # float32 | bf16 | int8 | int8-blocks | auto: the encoder's, corpus and queries
    )
    dimensions: int | None = None  # Matryoshka: the first N values of each embedding
    index: str | None = None  # an index directory: searched if it exists, else built there
    storage: str | None = None  # building an index: float32 | int8 | binary (None: float32)
    ann: str | None = None  # building an index: auto | hnsw | exact (None: auto)
    rerank: str | None = None  # a cross-encoder directory: reranks each query's first `rerank_top`
    rerank_top: int = 100
    # float32 | bf16 | int8-blocks | auto: what the cross-encoder scores in (None: as loaded)
    rerank_precision: str | None = None
    rerank_fusion: str = "none"  # none: the cross-encoder's order | rrf: fused with the first stage
    depth: int = 100  # documents retrieved per query (at least the deepest measure's cut-off)
    measures: tuple[str, ...] = DEFAULT_MEASURES
    query_prompt_name: str | None = None  # the model's named prompts, as encode(prompt_name=)
    document_prompt_name: str | None = None
    mode: str = "dense"  # dense | sparse | multivector | bm25 | hybrid: the first stage
    kinds: tuple[str, ...] | None = None  # hybrid: the kinds fused (None: every model given + bm25)
    fusion: str = "rrf"  # hybrid: rrf | weighted (clearformer.index.fusion)
    rrf_k: int = 60
    weights: dict[str, float] | None = None  # hybrid, weighted: per kind (default 1)
    normalization: str = "minmax"  # hybrid, weighted: minmax | zscore

    def __post_init__(self) -> None:
        modes = ("dense", "sparse", "multivector", "bm25", "hybrid")
        if self.mode not in modes:
            raise ValueError(f"mode must be one of {modes}, got {self.mode!r}")
        if self.mode != "dense" and (
            self.storage is not None or self.ann is not None or self.dimensions is not None
        ):
            raise ValueError("storage, ann and dimensions describe a dense index: use mode dense")
        if not self.measures:
            raise ValueError(
                "measures must name at least one measure (ndcg@K, mrr@K, recall@K, map@K or "
                "precision@K), got none"
            )
        for name in self.measures:
            parse_measure(name)
        deepest = max(parse_measure(name)[1] for name in self.measures)
        if self.depth < deepest:
            raise ValueError(
                f"depth must be at least the deepest cut-off {deepest}, got {self.depth}"
            )
        if self.rerank_top <= 0:
            raise ValueError(f"rerank_top must be a positive integer, got {self.rerank_top}")
        if isinstance(self.rrf_k, bool) or not isinstance(self.rrf_k, int) or self.rrf_k < 0:
            raise ValueError(f"rrf_k must be an integer >= 0, got {self.rrf_k!r}")
        # The canonical name ("bfloat16" -> "bf16"), checked before the data is read.
        if self.rerank_precision is not None:
            object.__setattr__(
                self,
                "rerank_precision",
                check_precision(
                    self.rerank_precision, "rerank_precision", (*CROSS_ENCODER_PRECISIONS, "auto")
                ),
            )
        if self.kinds is not None and not tuple(self.kinds):
            raise ValueError("kinds must name at least one kind (None: every kind), got none")
        if self.rerank_fusion not in RERANK_FUSIONS:
            raise ValueError(
                f"rerank_fusion must be one of {RERANK_FUSIONS}, got {self.rerank_fusion!r}"
            )
        if self.index is None and (self.storage is not None or self.ann is not None):
            raise ValueError("storage and ann describe an index: give index too")


@dataclass
class EvalResult:
    """What :func:`evaluate` found: the mean of each measure, each query's, and the run."""

    metrics: dict[str, float]
    per_query: dict[str, dict[str, float]]
    run: Run
    data: dict[str, Any]
    model: dict[str, Any]
    settings: dict[str, Any]
    seconds: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The ``--out`` file: metrics first; everything that says what was measured."""
        return {
            "metrics": self.metrics,
            "data": self.data,
            "model": self.model,
            "settings": self.settings,
            "seconds": self.seconds,
            "clearformer": __version__,
            "per_query": self.per_query,
        }


def evaluate(
    data: RetrievalData,
    encoder,
    settings: EvalSettings | None = None,
    *,
    cross_encoder=None,
    progress: Progress | None = None,
    encode_options: dict[str, Any] | None = None,
    models: dict[str, Any] | None = None,
) -> EvalResult:
    """Retrieve for every query of ``data`` with ``encoder`` as ``settings`` say; score it.

    Args:
        encoder: a :class:`~clearformer.TextEncoder`.
        cross_encoder: a :class:`~clearformer.CrossEncoder` for the rerank stage (else
            ``settings.rerank`` is loaded).
        progress: called with (phase, done, total) as texts are embedded and pairs scored.
        encode_options: passed to ``encode`` (``batch_size``, ``max_tokens``, ``workers``):
            speed and memory only.
        models: for ``settings.mode`` sparse, multivector or hybrid: kind -> model (a BGE-M3
            model may serve several kinds); ``encoder`` serves dense (None for bm25 alone).
    """
    from ..index.identity import ModelIdentity

    settings = EvalSettings() if settings is None else settings
    if settings.mode != "dense":
        return _evaluate_kinds(data, encoder, settings, models or {}, cross_encoder, progress)
    encode_options = dict(encode_options or {})
    settings = _with_side_prompts(settings, encoder)
    if settings.dimensions is not None:
        encoder.head.check_dimensions(settings.dimensions, "dimensions")
    cross_encoder = _rerank_stage(settings, cross_encoder)
    seconds: dict[str, float] = {}
    report = progress or (lambda phase, done, total: None)

    def embed(texts: list[str], phase: str, prompt_name: str | None) -> np.ndarray:
        start = time.perf_counter()
        report(phase, 0, len(texts))
        vectors = encoder.encode(
            texts,
            normalize=True,
            precision=settings.precision,
            dimensions=settings.dimensions,
            **side_prompt_options(prompt_name),
            progress=lambda done, total: report(phase, done, total),
            **encode_options,
        )
        seconds[phase] = time.perf_counter() - start
        return vectors

    index = None
    if settings.index is not None:
        index = _prepared_index(data, encoder, settings, report, encode_options, seconds)
    else:
        corpus = embed(data.corpus_texts, "corpus", settings.document_prompt_name)
    queries = embed(data.query_texts, "queries", settings.query_prompt_name)
    start = time.perf_counter()
    if index is not None:
        run = index_run(data.query_ids, queries, index, settings.depth)
    else:
        run = exact_run(data.query_ids, queries, data.corpus_ids, corpus, settings.depth)
    seconds["search"] = time.perf_counter() - start
    run = _reranked(run, data, cross_encoder, settings, report, seconds)
    per_query = evaluate_run(run, data.qrels, settings.measures)
    described = asdict(settings)
    if index is not None:
        described.update(_index_described(index))
    described.update(_rerank_described(cross_encoder, settings))
    # What ran, where a name runs as another here (int8 without int8 products, int8-blocks
    # without its kernel): the figures are that precision's.
    decide = getattr(encoder, "precision_for", None)
    described["precision_run"] = settings.precision if decide is None else (
        decide(settings.precision).choice
    )  # fmt: skip
    return EvalResult(
        metrics=mean_measures(per_query),
        per_query=per_query,
        run=run,
        data=data.describe(),
        model=ModelIdentity.of(encoder).to_dict(),
        settings=described,
        seconds={name: round(value, 3) for name, value in seconds.items()},
    )


def _rerank_stage(settings: EvalSettings, cross_encoder):
    """The cross-encoder of the rerank stage (``settings.rerank`` loaded, unless one is given),
    or None; its precision checked against it before any text is embedded (a name it cannot
    run there, such as int8-blocks on a GPU, or another than the one it was loaded in)."""
    if settings.rerank is not None and cross_encoder is None:
        from ..text import CrossEncoder

        cross_encoder = CrossEncoder.from_pretrained(settings.rerank)
    if cross_encoder is None:
        if settings.rerank_precision is not None:
            raise ValueError(
                f"rerank_precision applies with a cross-encoder (rerank= or cross_encoder=), "
                f"got rerank_precision={settings.rerank_precision!r} without one"
            )
        return None
    if cross_encoder.num_labels != 1:
        raise ValueError(
            f"the rerank stage needs one score per pair, but the cross-encoder "
            f"{cross_encoder.path} gives num_labels={cross_encoder.num_labels}"
        )
    cross_encoder.precision_for(settings.rerank_precision)
    return cross_encoder


def _reranked(run: Run, data, cross_encoder, settings: EvalSettings, report, seconds) -> Run:
    """``run`` with each query's first ``settings.rerank_top`` documents rescored by
    ``cross_encoder`` (``run`` itself without one); whatever the first stage was."""
    if cross_encoder is None:
        return run
    start = time.perf_counter()

    def score_pairs(pairs: list[tuple[str, str]]) -> np.ndarray:
        report("rerank", 0, len(pairs))
        scores = cross_encoder.predict(pairs, precision=settings.rerank_precision)
        report("rerank", len(pairs), len(pairs))
        return scores

    run = rerank_run(
        run,
        dict(zip(data.query_ids, data.query_texts, strict=True)),
        dict(zip(data.corpus_ids, data.corpus_texts, strict=True)),
        score_pairs,
        settings.rerank_top,
        fusion=settings.rerank_fusion,
        rrf_k=settings.rrf_k,
    )
    seconds["rerank"] = time.perf_counter() - start
    return run


def _rerank_described(cross_encoder, settings: EvalSettings) -> dict:
    """The cross-encoder's identity, and the precision it scored in here (``auto`` decided,
    and a name that runs as another on this machine: the figures are that precision's)."""
    if cross_encoder is None:
        return {"rerank_model": None, "rerank_precision_run": None}
    return {
        "rerank_model": {"name": cross_encoder.path.name, "path": str(cross_encoder.path)},
        "rerank_precision_run": cross_encoder.precision_for(settings.rerank_precision).choice,
    }


def _with_side_prompts(settings: EvalSettings, encoder) -> EvalSettings:
    """Each side's prompt name where the settings give none: the model's "query" prompt for
    the queries and its "document" prompt for the corpus, else none (not the model's default
    prompt), as sentence-transformers' InformationRetrievalEvaluator embeds them
    (encode_query, encode_document); recorded in the results as they ran."""
    from ..text.prompts import side_prompt_name

    named = getattr(getattr(encoder, "prompts", None), "prompts", None) or {}
    return replace(
        settings,
        query_prompt_name=settings.query_prompt_name or side_prompt_name(named, "query"),
        document_prompt_name=settings.document_prompt_name or side_prompt_name(named, "document"),
    )


def _index_described(index) -> dict:
    """The storage, search and width the index ran with: an existing index searched without
    ``--storage``, ``--ann`` or ``--dimensions`` runs its own, which None would misstate (None
    reads as float32, auto and the model's full width)."""
    width = index.dimensions
    return {
        "storage": index.options.storage,
        "ann": index.ann,  # what ``auto`` resolved to: hnsw or exact
        "dimensions": None if width == index.identity.width else width,
    }


def _prepared_index(data, encoder, settings: EvalSettings, report, encode_options, seconds):
    """The index at ``settings.index``: opened and checked against ``data``'s corpus, or built
    from it (with the corpus embedded as ``settings`` say)."""
    from ..index import IndexOptions, VectorIndex, build_index
    from ..index.layout import current_generation

    path = Path(settings.index)
    if path.exists() and current_generation(path) is not None:
        index = VectorIndex.open(path, encoder)
        _check_index_matches(index, data, settings, encoder)
        log.info("eval: searching the existing index %s (%d rows)", path, index.rows)
        return index
    options = IndexOptions(
        storage=settings.storage or "float32",
        dimensions=settings.dimensions,
        ann=settings.ann or "auto",
    )
    start = time.perf_counter()
    report("corpus", 0, len(data.corpus_texts))
    index = build_index(
        path,
        data.corpus_texts,
        encoder,
        ids=data.corpus_ids,
        options=options,
        source={"beir": str(data.folder), "sha256": data.sha256},
        precision=settings.precision,
        **side_prompt_options(settings.document_prompt_name),
        progress=lambda done, total: report("corpus", done, total),
        **encode_options,
    )
    seconds["corpus"] = time.perf_counter() - start
    return index.with_encoder(encoder)


def _check_index_matches(index, data: RetrievalData, settings: EvalSettings, encoder) -> None:
    """ValueError unless ``index`` holds ``data``'s corpus (its ids and texts, row by row)
    embedded as ``settings`` would embed it."""
    from ..checks import shortened
    from ..index.recipe import computed_precision, computed_prompt, index_precision, index_prompt

    asked = {"storage": settings.storage, "ann": settings.ann, "dimensions": settings.dimensions}
    held_by = {name: getattr(index.options, name) for name in asked}
    # The corpus as this run would embed it: an index embedded otherwise measures another
    # setup than the one the output records.
    asked["precision"] = computed_precision(encoder, settings.precision)
    held_by["precision"] = index_precision(index.meta)
    asked["document prompt"] = computed_prompt(
        encoder, side_prompt_options(settings.document_prompt_name)
    )
    held_by["document prompt"] = index_prompt(index.meta)
    for name, value in asked.items():
        held = held_by[name]
        if (value is not None or name == "document prompt") and value != held:
            raise ValueError(
                f"index {index.root} was built with {name} {held!r}, not the {value!r} this "
                "run asks for; give another --index path to build one"
            )
    if index.rows != len(data.corpus_ids):
        raise ValueError(
            f"index {index.root} holds {index.rows} rows, the corpus {len(data.corpus_ids)} "
            "documents: it was built from other texts"
        )
    rows = np.arange(index.rows, dtype=np.int64)[None, :]
    hits = index.hits(rows, np.zeros(rows.shape, np.float32))[0]
    for row, hit in enumerate(hits):
        if hit.id != data.corpus_ids[row]:
            raise ValueError(
                f"index {index.root} row {row} has id {hit.id!r}, the corpus "
                f"{data.corpus_ids[row]!r}: it was built from other texts"
            )
    # The same ids may name other texts (the corpus edited since the build): its vectors
    # would then be scored against these qrels in silence.
    for row, hit in enumerate(hits):
        if hit.text != data.corpus_texts[row]:
            raise ValueError(
                f"index {index.root} was built from other texts: its row {row} (id {hit.id!r}) "
                f"holds {shortened(repr(hit.text), 60)}, the corpus "
                f"{shortened(repr(data.corpus_texts[row]), 60)}; give another --index path to "
                "build one"
            )


def _evaluate_kinds(data, encoder, settings: EvalSettings, models, cross_encoder, progress):
    """``evaluate`` for mode sparse, multivector, bm25 or hybrid (exact, or through the
    kinds of the folder ``settings.index``)."""
    from ..index import Fusion
    from ..index.kinds import identity_of
    from .kind_runs import fused_run, kind_run

    report = progress or (lambda phase, done, total: None)
    models = dict(models)
    if encoder is not None:
        models.setdefault("dense", encoder)
    if settings.mode == "hybrid":
        given = [k for k in ("dense", "sparse", "multivector") if k in models]
        kinds = list(settings.kinds or [*given, "bm25"])
    else:
        kinds = [settings.mode]
    for kind in kinds:
        if kind != "bm25" and kind not in models:
            raise ValueError(f"mode {settings.mode}: the {kind} kind needs a {kind} model")
    cross_encoder = _rerank_stage(settings, cross_encoder)
    seconds: dict[str, float] = {}
    runs: dict[str, Run] = {}
    for kind in kinds:
        start = time.perf_counter()
        if kind == "dense":
            dense = evaluate(data, models["dense"], replace(settings, mode="dense", rerank=None,
                             rerank_precision=None, index=_dense_index(settings)))  # fmt: skip
            runs[kind] = dense.run
        else:
            runs[kind] = kind_run(kind, data, models.get(kind), settings, report)
        seconds[kind] = round(time.perf_counter() - start, 3)
    if len(kinds) == 1:
        run = runs[kinds[0]]
    else:
        fusion = Fusion(settings.fusion, k=settings.rrf_k, weights=settings.weights or {},
                        normalization=settings.normalization)  # fmt: skip
        run = fused_run(runs, fusion, settings.depth)
    run = _reranked(run, data, cross_encoder, settings, report, seconds)
    per_query = evaluate_run(run, data.qrels, settings.measures)
    described = asdict(settings)
    described["kinds"] = kinds
    described.update(_rerank_described(cross_encoder, settings))
    model = {kind: identity_of(m).to_dict() for kind, m in models.items() if kind in kinds}
    return EvalResult(
        metrics=mean_measures(per_query),
        per_query=per_query,
        run=run,
        data=data.describe(),
        model=model.get(kinds[0], {"name": "bm25"}) if len(kinds) == 1 else {"kinds": model},
        settings=described,
        seconds={name: round(value, 3) for name, value in seconds.items()},
    )


def _dense_index(settings: EvalSettings) -> str | None:
    """The dense sub-index of a folder of kinds, for a hybrid run through an index."""
    return None if settings.index is None else str(Path(settings.index) / "dense")
