"""Reading and writing the config.json fields BERT-family checkpoints share.

Used by the families' modules; the error messages name the config.json key, what was found
and what is supported.

config.json is untrusted input: every field that sizes the model or is read as a number is
checked for its type and a plausible range before anything is built, so that a vocabulary of
1e10 or a million layers is an error naming the field, not an allocation that runs the
machine out of memory. The ranges (:data:`LIMITS`) are far above every published
BERT-family checkpoint; :data:`MAX_PARAMETERS` bounds what the fields imply together.
"""

from __future__ import annotations

from typing import Any

from ....config import EncoderConfig
from ..files import CheckpointError

# Hugging Face activation names -> clearformer's. gelu_new / gelu_fast / gelu_pytorch_tanh are
# all the tanh approximation of GELU; plain "gelu" is the exact (erf) one.
FROM_HF_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
}
# clearformer's -> the name a saved config.json uses. The gated ones (swiglu, geglu) have no
# BERT-family equivalent: their feed-forward has a third matrix these checkpoints lack.
SAVED_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}


# Inclusive (low, high) of each model-sizing quantity. The largest published BERT-family
# checkpoints are far inside: width 1024-2560, 24-48 layers, vocabularies up to 250k.
LIMITS = {
    "width": (1, 16_384),
    "heads": (1, 1_024),
    "layers": (1, 512),
    "mlp": (1, 131_072),
    "vocab": (1, 2_097_152),
    "positions": (1, 131_072),
    "token_types": (0, 1_024),
}
# The parameters the fields imply together (4 bytes each in float32: 16 GiB at the limit).
MAX_PARAMETERS = 2**32
_MISSING = object()


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def require(hf: dict[str, Any], key: str, kind: type = int) -> Any:
    """``hf[key]``, which must be present (and an int, for ``kind=int``). For a field that
    sizes the model, :func:`integer` also checks its range."""
    if key not in hf:
        raise CheckpointError(f"config.json lacks {key!r}, needed for {hf.get('model_type')}")
    value = hf[key]
    if kind is int and not _is_int(value):
        raise CheckpointError(f"config.json {key!r} must be an int, got {value!r}")
    return value


def integer(hf: dict[str, Any], key: str, limit: str, default: Any = _MISSING) -> int:
    """``hf[key]`` (``default`` when absent) as an int within ``LIMITS[limit]``."""
    low, high = LIMITS[limit]
    if key not in hf and default is not _MISSING:
        return default
    if key not in hf:
        raise CheckpointError(f"config.json lacks {key!r}, needed for {hf.get('model_type')}")
    value = hf[key]
    if not _is_int(value) or not low <= value <= high:
        raise CheckpointError(
            f"config.json {key!r} must be an int in [{low:,}, {high:,}], got {value!r}"
        )
    return value


def number(hf: dict[str, Any], key: str, default: float, *, low: float, high: float) -> float:
    """``hf[key]`` (``default`` when absent) as a float in ``[low, high)``: a dropout rate or a
    norm epsilon. A string or null is an error naming the field, not a float() traceback."""
    value = hf.get(key, default)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise CheckpointError(f"config.json {key!r} must be a number, got {value!r}")
    if not low <= value < high:
        raise CheckpointError(f"config.json {key!r} must be in [{low}, {high}), got {value!r}")
    return float(value)


def token_id(hf: dict[str, Any], key: str, default: int | None, vocab_size: int) -> int | None:
    """A token id field (``pad_token_id``): null or an int in ``[0, vocab_size)``."""
    value = hf.get(key, default)
    if value is None:
        return None
    if not _is_int(value) or not 0 <= value < vocab_size:
        raise CheckpointError(
            f"config.json {key!r} must be null or an int in [0, {vocab_size}) "
            f"(vocab_size), got {value!r}"
        )
    return value


def check_heads(hf: dict[str, Any], width_key: str, heads_key: str) -> None:
    """The heads must split the width evenly (read the two fields first)."""
    width, heads = hf[width_key], hf[heads_key]
    if width % heads:
        raise CheckpointError(
            f"config.json {width_key!r}={width} must be divisible by {heads_key!r}={heads}"
        )


def check_size(
    *, width: int, layers: int, mlp: int, vocab: int, positions: int, token_types: int
) -> None:
    """Refuse fields that are each plausible but together describe a model too large to hold
    (more than :data:`MAX_PARAMETERS`), before anything is allocated."""
    embeddings = (vocab + positions + token_types) * width
    per_layer = 4 * width * width + 2 * width * mlp  # q, k, v, out; the feed-forward pair
    total = embeddings + layers * per_layer
    if total > MAX_PARAMETERS:
        raise CheckpointError(
            f"config.json describes a model of {total:,} parameters (at least "
            f"{total * 2 / 2**30:,.0f} GiB), more than the {MAX_PARAMETERS:,} clearformer "
            "accepts; check its sizes (vocab_size, hidden size, layers)"
        )


def check_rope_scaling(hf: dict[str, Any]) -> None:
    """Refuse a legacy ``rope_scaling`` that scales the rotary positions. One of type
    ``"default"`` (``rope_type`` or the older ``type``) is plain rotary positions, as
    transformers 5 reads it, and so is an empty one: both are as if absent."""
    scaling = hf.get("rope_scaling")
    if not scaling:
        return
    if isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type")) == "default":
        return
    raise CheckpointError(
        f"config.json 'rope_scaling' must be null or of type 'default' (scaled rotary positions "
        f"are not supported), got {scaling!r}"
    )


def activation(name: Any, key: str) -> str:
    """clearformer's name for the Hugging Face activation ``name`` read from ``key``."""
    if not isinstance(name, str) or name not in FROM_HF_ACTIVATIONS:
        raise CheckpointError(
            f"unsupported activation {key}={name!r} in config.json; supported: "
            f"{', '.join(FROM_HF_ACTIVATIONS)}"
        )
    return FROM_HF_ACTIVATIONS[name]


def hf_activation(config: EncoderConfig, family: str) -> str:
    """The config.json activation name for ``config.activation``."""
    if config.activation not in SAVED_ACTIVATIONS:
        raise CheckpointError(
            f"activation must be one of {', '.join(SAVED_ACTIVATIONS)} to save a {family} "
            f"checkpoint (BERT-family configs have no gated feed-forward), got "
            f"activation={config.activation!r}"
        )
    return SAVED_ACTIVATIONS[config.activation]


def attn_dropout(config: EncoderConfig) -> float:
    """The attention dropout ``config`` runs with (``attn_dropout`` None = ``dropout``)."""
    return config.dropout if config.attn_dropout is None else config.attn_dropout


def labels(hf: dict[str, Any]) -> tuple[int, tuple[str, ...]]:
    """(num_labels, label names) of a task config: ``id2label`` as transformers writes it
    (keys "0", "1", ...), else ``num_labels``, else transformers' default of 2 unnamed."""
    id2label = hf.get("id2label")
    if isinstance(id2label, dict) and id2label:
        try:
            order = sorted(id2label, key=int)
        except (TypeError, ValueError):
            raise CheckpointError(
                f"config.json 'id2label' keys must be label indices 0..n-1, got {list(id2label)}"
            ) from None
        if [int(k) for k in order] != list(range(len(order))):
            raise CheckpointError(
                f"config.json 'id2label' keys must be label indices 0..n-1, got {order}"
            )
        return len(order), tuple(str(id2label[k]) for k in order)
    count = hf.get("num_labels", 2)
    if not _is_int(count) or not 1 <= count <= LIMITS["width"][1]:
        raise CheckpointError(f"config.json 'num_labels' must be an int >= 1, got {count!r}")
    return count, ()


def flag(hf: dict[str, Any], key: str, default: bool) -> bool:
    """A true/false field."""
    value = hf.get(key, default)
    if not isinstance(value, bool):
        raise CheckpointError(f"config.json {key!r} must be true or false, got {value!r}")
    return value
