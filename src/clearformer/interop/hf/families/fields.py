"""Reading and writing the config.json fields BERT-family checkpoints share.

Used by the families' modules; the error messages name the config.json key, what was found
and what is supported.
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


def require(hf: dict[str, Any], key: str, kind: type = int) -> Any:
    """``hf[key]``, which must be present (and an int, for ``kind=int``)."""
    if key not in hf:
        raise CheckpointError(f"config.json lacks {key!r}, needed for {hf.get('model_type')}")
    value = hf[key]
    if kind is int and (not isinstance(value, int) or isinstance(value, bool)):
        raise CheckpointError(f"config.json {key!r} must be an int, got {value!r}")
    return value


def activation(name: Any, key: str) -> str:
    """clearformer's name for the Hugging Face activation ``name`` read from ``key``."""
    if name not in FROM_HF_ACTIVATIONS:
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
