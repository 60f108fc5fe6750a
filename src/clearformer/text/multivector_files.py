"""What ``MultiVectorEncoder.from_pretrained`` reads from a ColBERT-style directory.

Two layouts carry the same model (a BERT-family backbone, a projection of every token's state,
marker prompts, query expansion, a document skiplist), in two spellings:

* **sentence-transformers 6** (``config_sentence_transformers.json`` ``"model_type":
  "MultiVectorEncoder"``): ``modules.json`` lists Transformer -> Dense (on
  ``token_embeddings``) -> MultiVectorMask -> Normalize. The query and document prompts are
  texts in ``prompts``; ``sentence_bert_config.json`` holds ``query_length``,
  ``document_length`` and ``query_expansion`` (``{"strategy": "fixed" | "min", "attend",
  "token", "length"}``); ``2_MultiVectorMask/config.json`` the ``skiplist_words`` and the sides
  (``skiplist_tasks``) they apply to.
* **PyLate** (``"model_type": "ColBERT"``): modules Transformer -> ``pylate.models.Dense.Dense``
  (``1_Dense``) only; ``config_sentence_transformers.json`` holds ``query_prefix`` /
  ``document_prefix`` (``"[Q] "`` / ``"[D] "``, tokens PyLate added to the vocabulary and
  inserts after the first token), ``query_length``, ``document_length``,
  ``do_query_expansion``, ``attend_to_expansion_tokens`` and ``skiplist_words``; the vectors are
  always normalised, the skiplist applies to documents.

Both become one :class:`MultiVectorConfig`: how each side is tokenized and which of its token
vectors are kept.
"""

from __future__ import annotations

import logging
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor

from ..heads.sentence import DenseConfig
from ..interop.hf.files import CheckpointError, CheckpointFiles, read_json
from ..interop.hf.st_modules import module_kind, read_dense
from ..model_kinds import KIND_CLASSES

log = logging.getLogger(__name__)

LAYOUTS = ("sentence-transformers", "pylate")
SIMILARITIES = ("maxsim", "meanmaxsim")
# The sentence-transformers modules a multi-vector directory may list, by their last name.
_MODULES = ("Transformer", "Dense", "MultiVectorMask", "Normalize")
# PyLate's defaults, used where its config leaves a field out (pylate.models.ColBERT).
_PYLATE_DEFAULTS = {
    "query_prefix": "[Q] ",
    "document_prefix": "[D] ",
    "query_length": 32,
    "document_length": 180,
    "do_query_expansion": True,
    "attend_to_expansion_tokens": False,
}
# Files beside the backbone whose presence makes a directory bge-m3 (FlagEmbedding's heads).
BGE_M3_HEADS = ("colbert_linear", "sparse_linear")


@dataclass(frozen=True)
class QueryExpansion:
    """ColBERT's query expansion: queries padded with [MASK] tokens up to ``length``.

    Attributes:
        length: tokens of an expanded query, special tokens and markers included.
        strategy: ``"fixed"``: queries are cut to ``length`` as well; ``"min"``: ``length`` is
            only the floor.
        attend: whether the encoder's attention sees the expansion tokens (False, classic
            ColBERT: they read the query but the query does not read them).
        token_id: the id put at the expansion positions (the [MASK] token's).
    """

    length: int
    strategy: str
    attend: bool
    token_id: int


@dataclass(frozen=True)
class SideConfig:
    """How the texts of one side (queries or documents) become token vectors.

    Attributes:
        max_length: tokens a text is cut to, special tokens and the marker included.
        prompt: text put before every text ("" = none).
        marker_id: a marker token inserted after the first token (PyLate's [Q] / [D]); None =
            none.
        expansion: the query expansion; None = none.
        score_expansion: whether the expansion tokens' vectors are kept.
        skiplist: token ids whose vectors are dropped (punctuation, for documents).
    """

    max_length: int
    prompt: str = ""
    marker_id: int | None = None
    expansion: QueryExpansion | None = None
    score_expansion: bool = True
    skiplist: frozenset[int] = frozenset()


@dataclass(frozen=True)
class MultiVectorConfig:
    """A multi-vector directory, read.

    Attributes:
        layout: ``"sentence-transformers"`` or ``"pylate"``.
        query, document: each side's :class:`SideConfig`.
        projection: the Dense layers on every token's state, in order.
        normalize: whether each token vector is L2-normalised.
        truncate_dim: the width vectors are cut to (then normalised), None = the full width.
        similarity: ``"maxsim"``, or ``"meanmaxsim"`` (MaxSim over the query's token count).
    """

    layout: str
    query: SideConfig
    document: SideConfig
    projection: tuple[DenseConfig, ...]
    normalize: bool
    truncate_dim: int | None
    similarity: str
    d_model: int

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS or self.similarity not in SIMILARITIES:
            raise ValueError(
                f"MultiVectorConfig layout must be one of {LAYOUTS} and similarity one of "
                f"{SIMILARITIES}, got {self.layout!r}, {self.similarity!r}"
            )

    @property
    def width(self) -> int:
        """Width of the token vectors: the cut, else the last Dense layer's, else D."""
        if self.truncate_dim is not None:
            return self.truncate_dim
        return self.projection[-1].out_features if self.projection else self.d_model


def st_config(root: Path) -> dict[str, Any]:
    """``config_sentence_transformers.json`` as a dict ({} when absent)."""
    file = root / "config_sentence_transformers.json"
    if not file.is_file():
        return {}
    config = read_json(file, "sentence-transformers config")
    return config if isinstance(config, dict) else {}


def kind_error(root: Path, kind: str, cls: str) -> CheckpointError:
    """The one-line error for ``cls`` asked to load ``root``, a ``kind`` model it cannot."""
    return CheckpointError(
        f"{root} is a {kind} model, which {cls} cannot load; use "
        f"clearformer.{KIND_CLASSES[kind]}.from_pretrained({str(root)!r})"
    )


def read_multivector_config(
    files: CheckpointFiles,
    token_id,
    d_model: int,
    lengths: tuple[int, int],
    max_length: int | None,
) -> tuple[MultiVectorConfig, dict[str, Tensor]]:
    """The :class:`MultiVectorConfig` of a directory and the state dict of its projection
    (``<i>.linear.weight``, ...). ``token_id`` maps a token's text to its id (None: not in the
    vocabulary); ``lengths`` is (the cut where a side names none, the model's limit of
    positions); ``max_length`` a caller's cut for texts (queries with a fixed expansion keep
    their length).

    Raises:
        CheckpointError: an unknown layout, a module clearformer does not run, a field of the
            wrong type, naming the file and the field.
    """
    root = files.path
    config = st_config(root)
    model_type = config.get("model_type")
    kinds = {module_kind(m) for m in files.modules or []}
    if model_type == "MultiVectorEncoder" or (model_type is None and "MultiVectorMask" in kinds):
        read = _sentence_transformers_layout
    elif model_type == "ColBERT":
        read = _pylate_layout
    else:
        if "HF_ColBERT" in (files.config.get("architectures") or []):
            raise CheckpointError(
                f"{root} is a Stanford-NLP ColBERT checkpoint (architectures HF_ColBERT), which "
                "clearformer does not load; save it with sentence-transformers' "
                "MultiVectorEncoder or PyLate first"
            )
        raise CheckpointError(
            f"{root / 'config_sentence_transformers.json'} 'model_type' must be "
            f"'MultiVectorEncoder' or 'ColBERT' (PyLate) for a multi-vector model, got "
            f"{model_type!r}"
        )
    layout, query, document, normalize, projection, tensors = read(
        files, config, token_id, d_model, lengths
    )
    if max_length is not None:
        document = _cut(document, max_length)
        if query.expansion is None or query.expansion.strategy == "min":
            query = _cut(query, max_length)
    truncate_dim = config.get("truncate_dim")
    if truncate_dim is not None and (
        isinstance(truncate_dim, bool) or not isinstance(truncate_dim, int) or truncate_dim < 1
    ):
        raise CheckpointError(
            f"{root / 'config_sentence_transformers.json'} 'truncate_dim' must be a positive "
            f"int, got {truncate_dim!r}"
        )
    similarity = str(config.get("similarity_fn_name") or "maxsim").lower()
    if similarity not in SIMILARITIES:
        raise CheckpointError(
            f"{root / 'config_sentence_transformers.json'} 'similarity_fn_name' must be one of "
            f"{SIMILARITIES}, got {config.get('similarity_fn_name')!r}"
        )
    mv = MultiVectorConfig(
        layout, query, document, projection, normalize, truncate_dim, similarity, d_model
    )
    if truncate_dim is not None and truncate_dim > (
        projection[-1].out_features if projection else d_model
    ):
        raise CheckpointError(
            f"{root / 'config_sentence_transformers.json'} 'truncate_dim'={truncate_dim} is wider "
            "than the token vectors"
        )
    return mv, tensors


def _cut(side: SideConfig, max_length: int) -> SideConfig:
    from dataclasses import replace

    return replace(side, max_length=min(side.max_length, max_length))


def _sentence_transformers_layout(files, config, token_id, d_model, lengths):
    root = files.path
    modules = files.modules or []
    kinds = [module_kind(m) for m in modules]
    unknown = [k for k in kinds if k not in _MODULES]
    if unknown or kinds[:1] != ["Transformer"] or kinds.count("Transformer") != 1:
        raise CheckpointError(
            f"{root / 'modules.json'} must list a Transformer, then Dense, MultiVectorMask and "
            f"Normalize modules (clearformer runs {', '.join(_MODULES)}); got {kinds}"
        )
    projection, tensors = _projection(root, modules, d_model)
    mask_modules = [m for m in modules if module_kind(m) == "MultiVectorMask"]
    skip_words: list[str] = []
    skip_sides = ["document"]
    for module in mask_modules:
        file = root / str(module.get("path", "")) / "config.json"
        raw = read_json(file, "MultiVectorMask config") if file.is_file() else {}
        if raw.get("keep_only_token_ids"):
            raise CheckpointError(
                f"{file} 'keep_only_token_ids' is set (an image-patch allowlist); clearformer "
                "embeds texts only"
            )
        skip_words = list(raw.get("skiplist_words") or [])
        tasks = raw.get("skiplist_tasks") or ["document"]
        skip_sides = [tasks] if isinstance(tasks, str) else list(tasks)
    sentence = files.sentence_config
    prompts = config.get("prompts") or {}
    expansion = _expansion(sentence.get("query_expansion"), root, token_id, files)
    skiplist = _skiplist(skip_words, token_id, root)
    sides = {}
    for name in ("query", "document"):
        length = _length(sentence.get(f"{name}_length"), f"{name}_length", root, lengths)
        expand = expansion if name == "query" else None
        if expand is not None:
            length = expand.length if expand.strategy == "fixed" else max(length, expand.length)
        sides[name] = SideConfig(
            max_length=length,
            prompt=str(prompts.get(name) or ""),
            expansion=expand,
            # Expansion positions count where a MultiVectorMask says so, or where the encoder
            # attends to them (then they are in the attention mask sentence-transformers reads).
            score_expansion=bool(mask_modules) or bool(expand and expand.attend),
            skiplist=skiplist if name in skip_sides and mask_modules else frozenset(),
        )
    normalize = "Normalize" in kinds
    return (
        "sentence-transformers",
        sides["query"],
        sides["document"],
        normalize,
        projection,
        tensors,
    )


def _pylate_layout(files, config, token_id, d_model, lengths):
    root = files.path
    modules = files.modules or []
    kinds = [module_kind(m) for m in modules]
    if kinds[:1] != ["Transformer"] or any(k != "Dense" for k in kinds[1:]):
        raise CheckpointError(
            f"{root / 'modules.json'} must list a Transformer, then Dense modules (PyLate's "
            f"layout); got {kinds}"
        )
    projection, tensors = _projection(root, modules, d_model)
    value = {key: config.get(key, default) for key, default in _PYLATE_DEFAULTS.items()}
    value = {key: (_PYLATE_DEFAULTS[key] if v is None else v) for key, v in value.items()}
    words = config.get("skiplist_words")
    skiplist = _skiplist(list(string.punctuation) if words is None else list(words), token_id, root)
    prompts = config.get("prompts") or {}
    sides = {}
    for name in ("query", "document"):
        prefix = str(value[f"{name}_prefix"])
        length = _length(value[f"{name}_length"], f"{name}_length", root, lengths)
        marker, prompt = _marker(prefix, token_id)
        # A prompt saved besides the prefix follows it, as sentence-transformers composes them.
        prompt += str(prompts.get(name) or "").removeprefix(prefix)
        expand = None
        if name == "query" and _flag(value["do_query_expansion"], "do_query_expansion", root):
            attend = _flag(value["attend_to_expansion_tokens"], "attend_to_expansion_tokens", root)
            expand = QueryExpansion(
                length, "fixed", attend, _expansion_token(None, token_id, files)
            )
        sides[name] = SideConfig(
            max_length=length,
            prompt=prompt,
            marker_id=marker,
            expansion=expand,
            score_expansion=True,
            skiplist=skiplist if name == "document" else frozenset(),
        )
    return "pylate", sides["query"], sides["document"], True, projection, tensors


def _projection(root: Path, modules: list[dict], d_model: int):
    projection: list[DenseConfig] = []
    tensors: dict[str, Tensor] = {}
    width = d_model
    for module in modules:
        if module_kind(module) != "Dense":
            continue
        dense, weights = read_dense(
            root / str(module.get("path", "")), width, on="token_embeddings"
        )
        tensors.update({f"{len(projection)}.{k}": v for k, v in weights.items()})
        projection.append(dense)
        width = dense.out_features
    return tuple(projection), tensors


def _marker(prefix: str, token_id) -> tuple[int | None, str]:
    """PyLate's prefix as (marker id, "") when the vocabulary holds it as one token (with its
    trailing space, as PyLate adds it, or without), else (None, the prefix as text)."""
    if not prefix.strip():
        return None, ""
    for name in (prefix, prefix.split(None, 1)[0]):
        found = token_id(name)
        if found is not None:
            return found, ""
    return None, prefix


def _expansion(raw: Any, root: Path, token_id, files) -> QueryExpansion | None:
    if raw is None:
        return None
    file = root / "sentence_bert_config.json"
    if not isinstance(raw, dict) or raw.get("strategy") not in ("fixed", "min"):
        raise CheckpointError(
            f"{file} 'query_expansion' must be null or an object with 'strategy' 'fixed' or "
            f"'min', got {raw!r}"
        )
    length = raw.get("length")
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise CheckpointError(
            f"{file} 'query_expansion.length' must be a positive int, got {length!r}"
        )
    attend = _flag(raw.get("attend", False), "query_expansion.attend", file)
    return QueryExpansion(
        length, raw["strategy"], attend, _expansion_token(raw.get("token"), token_id, files)
    )


def _expansion_token(name: str | None, token_id, files) -> int:
    """The expansion token's id: ``name``'s, else the tokenizer's mask token's, else its
    end-of-sequence token's (PyLate's and sentence-transformers' order)."""
    from ..interop.hf.vocab_files import token_text

    names = (
        [name]
        if name is not None
        else [
            token_text(files.tokenizer_config.get(key), default)
            for key, default in (("mask_token", "[MASK]"), ("eos_token", "</s>"))
        ]
    )
    for candidate in names:
        found = token_id(candidate)
        if found is not None:
            return found
    raise CheckpointError(
        f"{files.path}: query expansion needs the token {names[0]!r}, which the tokenizer "
        "does not have"
    )


def _skiplist(words: list[str], token_id, root: Path) -> frozenset[int]:
    ids, missing = set(), []
    for word in words:
        found = token_id(word)
        (missing.append(word) if found is None else ids.add(found))
    if missing:
        # sentence-transformers drops them too: they would otherwise skip every unknown token.
        log.warning("%s: skiplist words not in the vocabulary, ignored: %s", root, missing)
    return frozenset(ids)


def _length(value: Any, name: str, root: Path, lengths: tuple[int, int]) -> int:
    default, limit = lengths
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CheckpointError(f"{root}: {name!r} must be a positive int, got {value!r}")
    if value > limit:
        raise CheckpointError(
            f"{root}: {name!r}={value} is above the model's limit of {limit} positions"
        )
    return value


def _flag(value: Any, name: str, where: Path) -> bool:
    if not isinstance(value, bool):
        raise CheckpointError(f"{where}: {name!r} must be true or false, got {value!r}")
    return value
