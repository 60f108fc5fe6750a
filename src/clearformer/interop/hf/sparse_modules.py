"""What a sentence-transformers ``SparseEncoder`` directory asks for, read before any weight.

Two layouts, as sentence-transformers 5 and 6 write them:

* SPLADE: ``modules.json`` lists a masked-LM transformer (``Transformer`` with
  ``"transformer_task": "fill-mask"`` in its ``sentence_bert_config.json``, or the older
  ``MLMTransformer``) and a ``SpladePooling``; queries and documents take the same path.
* inference-free SPLADE: one ``Router`` module whose ``router_config.json`` sends each task to
  its own modules, typically queries to a ``SparseStaticEmbedding`` (one learned weight per
  vocabulary entry, looked up per token: no model runs for a query) and documents to the
  masked-LM transformer and ``SpladePooling``. The route of a task is resolved as
  sentence-transformers' ``Router`` resolves it for text.

Each side is a :class:`SpladeSide` (a checkpoint folder and its pooling) or a
:class:`StaticSide` (a weights file and a tokenizer).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...heads.splade import SpladeConfig
from .files import CheckpointError, read_json
from .sentence_transformers import Prompts, prompts_from_files

TASKS = ("query", "document")
_MLM = ("Transformer", "MLMTransformer")


@dataclass(frozen=True)
class SpladeSide:
    """A masked-LM checkpoint at ``folder`` pooled by SPLADE; ``max_length`` is the task's own
    length (``query_length``/``document_length``; None: the checkpoint's)."""

    folder: Path
    splade: SpladeConfig
    max_length: int | None = None


@dataclass(frozen=True)
class StaticSide:
    """A ``SparseStaticEmbedding``: ``folder`` holds its weights (``model.safetensors``, one
    value per vocabulary entry) and its tokenizer, run without special tokens."""

    folder: Path


@dataclass(frozen=True)
class SparseLayout:
    """A SparseEncoder directory: how each task is encoded, and its settings.

    Attributes:
        root: the directory.
        sides: ``"query"`` and ``"document"`` -> a :class:`SpladeSide` or :class:`StaticSide`.
        max_active_dims: ``config_sentence_transformers.json``'s (None: keep every weight).
        prompts: the named prompts (``{"query": "", "document": ""}`` as saved by default).
    """

    root: Path
    sides: dict[str, SpladeSide | StaticSide]
    max_active_dims: int | None
    prompts: Prompts


def read_sparse_layout(root: Path) -> SparseLayout:
    """The layout of the SparseEncoder directory ``root``.

    Raises:
        CheckpointError: a module list clearformer does not run as a sparse encoder (naming
            the modules), an unreadable Router, or a ``max_active_dims`` that is not a
            positive int.
    """
    modules = read_json(root / "modules.json", "sentence-transformers modules")
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise CheckpointError(f"{root / 'modules.json'} must hold a JSON list of objects")
    kinds = [_type_name(m) for m in modules]
    if kinds == ["Router"]:
        sides = _router_sides(root / str(modules[0].get("path", "")))
    else:
        listed = [(root / str(m.get("path", "")), _type_name(m)) for m in modules]
        # Per task: the two sides are equal (one model loaded) unless the transformer's
        # query_length and document_length differ.
        sides = {task: _side(root, listed, task) for task in TASKS}
    st_file = root / "config_sentence_transformers.json"
    st_config = read_json(st_file, "sentence-transformers config") if st_file.is_file() else {}
    max_active = st_config.get("max_active_dims") if isinstance(st_config, dict) else None
    if max_active is not None and (
        isinstance(max_active, bool) or not isinstance(max_active, int) or max_active <= 0
    ):
        raise CheckpointError(
            f"{st_file} 'max_active_dims' must be a positive int or null, got {max_active!r}"
        )
    return SparseLayout(root, sides, max_active, prompts_from_files(root))


def _type_name(module: dict[str, Any]) -> str:
    return str(module.get("type", "")).rsplit(".", 1)[-1]


def _side(root: Path, modules: list[tuple[Path, str]], task: str, routed: bool = False):
    """One route's modules -> a side; anything else is refused, naming the modules."""
    kinds = [kind for _, kind in modules]
    if kinds == ["SparseStaticEmbedding"]:
        return StaticSide(modules[0][0])
    if len(kinds) == 2 and kinds[0] in _MLM and kinds[1] == "SpladePooling":
        folder, _ = modules[0]
        sentence = _json(folder / "sentence_bert_config.json")
        task_kind = sentence.get(
            "transformer_task", "fill-mask" if kinds[0] == "MLMTransformer" else None
        )
        if task_kind != "fill-mask":
            raise CheckpointError(
                f"{folder / 'sentence_bert_config.json'} 'transformer_task' must be 'fill-mask' "
                f"for a SPLADE model, got {task_kind!r}"
            )
        if sentence.get("query_expansion") is not None:
            raise CheckpointError(
                f"{folder / 'sentence_bert_config.json'} asks for query_expansion, which "
                "clearformer's SparseEncoder does not run"
            )
        pooling = _json(modules[1][0] / "config.json")
        try:
            splade = SpladeConfig(
                pooling=pooling.get("pooling_strategy", "max"),
                activation=pooling.get("activation_function", "relu"),
            )
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"{modules[1][0] / 'config.json'}: {exc}") from None
        length = sentence.get(f"{task}_length")
        return SpladeSide(folder, splade, length if isinstance(length, int) else None)
    where = f"the {task!r} route of {root}" if routed else str(root / "modules.json")
    raise CheckpointError(
        f"{where} has modules {kinds}; clearformer's SparseEncoder runs a fill-mask "
        "Transformer followed by SpladePooling, or a SparseStaticEmbedding"
    )


def _router_sides(folder: Path) -> dict[str, SpladeSide | StaticSide]:
    """Each task's side of a Router (``router_config.json``, or ``config.json`` before it)."""
    file = folder / "router_config.json"
    if not file.is_file():
        file = folder / "config.json"
    config = read_json(file, "Router config") if file.is_file() else None
    if not isinstance(config, dict) or not isinstance(config.get("structure"), dict):
        raise CheckpointError(f"{folder} has no readable Router config (router_config.json)")
    types, structure = config.get("types", {}), config["structure"]
    params = config.get("parameters", {}) or {}
    routes = {}
    for task in TASKS:
        route = _resolve_route(task, structure, params, file)
        ids = structure[route]
        routes[task] = _side(
            folder,
            [(folder / str(i), str(types.get(i, "")).rsplit(".", 1)[-1]) for i in ids],
            task,
            routed=True,
        )
    return routes


def _resolve_route(task: str, structure: dict, params: dict, source: Path) -> str:
    """sentence-transformers' ``Router._resolve_route`` for a text input of ``task``: the
    mappings (task and modality, task, modality, neither), then the task's own route, then a
    route named after the modality; a task with none of them has no route (the default route
    serves only calls without a task, which encode_query and encode_document never are)."""
    mappings = {}
    for key, route in (params.get("route_mappings") or {}).items():
        try:
            mappings[ast.literal_eval(key) if isinstance(key, str) else tuple(key)] = route
        except (ValueError, SyntaxError):
            continue  # sentence-transformers skips such a key too, with a warning
    for key in ((task, "text"), (task, None), (None, "text"), (None, None)):
        if key in mappings:
            return _existing(mappings[key], structure, source)
    for route in (task, "text"):
        if route in structure:
            return route
    raise CheckpointError(f"{source} has no route for task {task!r}; routes: {list(structure)}")


def _existing(route: str, structure: dict, source: Path) -> str:
    if route not in structure:
        raise CheckpointError(
            f"{source} routes to {route!r}, which is not one of {list(structure)}"
        )
    return route


def _json(path: Path) -> dict[str, Any]:
    value = read_json(path, "module config") if path.is_file() else {}
    return value if isinstance(value, dict) else {}
