"""ModernBERT (Warner et al., 2024): pre-norm, rotary positions, local and global layers, GeGLU.

The layout, as transformers' ``ModernBertModel`` builds it:

* embeddings: token embedding -> LayerNorm (no bias) -> dropout; no position or token types;
* pre-norm blocks without biases; layer 0 has no attention norm; a final norm;
* attention: one fused ``Wqkv`` (rows q; k; v), rotate-half rotary positions over the whole
  head width; layer i is global when ``i % global_attn_every_n_layers == 0``, else local, seeing
  keys with |i - j| <= ``local_attention // 2``; the rotary base is ``global_rope_theta`` on
  global layers and ``local_rope_theta`` on local ones;
* feed-forward: ``Wi`` gives 2 * I outputs, GELU of the first half times the second, ``Wo``.

Configs come in two spellings: transformers 5 writes ``layer_types`` and ``rope_parameters``;
hub configs of earlier versions carry ``global_attn_every_n_layers``, ``global_rope_theta`` and
``local_rope_theta``. Both read to the same :class:`~clearformer.EncoderConfig`; a save writes
both, so either version of transformers reads it.

Rotary positions count each sequence's real tokens: with right padding (what tokenizers do)
that equals transformers' ``0, 1, 2, ...``; with left padding transformers would count the
padding too, clearformer does not (so the packed and padded paths agree).

Dropout is placed as in clearformer's blocks (after attention and the feed-forward network),
not inside the attention output and the GLU as in transformers: inference is identical,
training regularises slightly differently.
"""

from __future__ import annotations

from typing import Any

from ....config import EncoderConfig
from ....heads import CLASSIFIER_ACTIVATIONS, ClassifierConfig, MaskedLMConfig
from ..files import CheckpointError
from .family import Family, HeadLayout, NameTable
from .fields import check_heads, check_rope_scaling, flag, integer, labels, number, token_id
from .tables import head_names

GLOBAL, LOCAL = "full_attention", "sliding_attention"
DEFAULT_THETA = {GLOBAL: 160_000.0, LOCAL: 10_000.0}


def _global_every(hf: dict[str, Any], n_layers: int) -> int:
    """The period of global layers, from ``layer_types`` (v5) or the legacy integer."""
    types = hf.get("layer_types")
    if types is None:
        return integer(hf, "global_attn_every_n_layers", "layers", 3)
    if not isinstance(types, list) or len(types) != n_layers or set(types) - {GLOBAL, LOCAL}:
        raise CheckpointError(
            f"config.json 'layer_types' must list {n_layers} of {GLOBAL!r} / {LOCAL!r}, "
            f"got {types!r}"
        )
    for every in range(1, n_layers + 1):
        if types == [GLOBAL if i % every == 0 else LOCAL for i in range(n_layers)]:
            return every
    raise CheckpointError(
        f"config.json 'layer_types' must make every n-th layer global (layer 0 first), got "
        f"{types!r}"
    )


def _theta(hf: dict[str, Any], kind: str, legacy_key: str) -> float:
    params = hf.get("rope_parameters") or {}
    entry = params.get(kind) or {}
    rope_type = entry.get("rope_type", "default")
    if rope_type != "default":
        raise CheckpointError(
            f"config.json rope_parameters[{kind!r}]['rope_type'] must be 'default', got "
            f"{rope_type!r}"
        )
    if "rope_theta" in entry:
        source, value = f"rope_parameters[{kind!r}]['rope_theta']", entry["rope_theta"]
    else:
        source, value = legacy_key, hf.get(legacy_key, DEFAULT_THETA[kind])
    if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
        raise CheckpointError(f"config.json {source} must be a number > 0, got {value!r}")
    return float(value)


def read_config(hf: dict[str, Any], backend: str) -> EncoderConfig:
    width = integer(hf, "hidden_size", "width")
    heads = integer(hf, "num_attention_heads", "heads")
    check_heads(hf, "hidden_size", "num_attention_heads")
    n_layers = integer(hf, "num_hidden_layers", "layers")
    vocab = integer(hf, "vocab_size", "vocab")
    biases = {key: hf.get(key, False) for key in ("norm_bias", "attention_bias", "mlp_bias")}
    if any(value is not False for value in biases.values()):
        raise CheckpointError(
            f"config.json norm_bias, attention_bias and mlp_bias must be false (ModernBERT "
            f"has no biases; others are not supported), got {biases}"
        )
    act = hf.get("hidden_activation", "gelu")
    if act != "gelu":
        raise CheckpointError(
            f"config.json 'hidden_activation' must be 'gelu' (GeGLU with exact GELU), got {act!r}"
        )
    window = integer(hf, "local_attention", "positions", 128)  # odd: // 2, as transformers
    check_rope_scaling(hf)
    if (width // heads) % 2:
        raise CheckpointError(
            f"config.json 'hidden_size' / 'num_attention_heads' = {width // heads} must be even "
            "for rotary positions"
        )
    return EncoderConfig(
        d_model=width,
        n_heads=heads,
        n_layers=n_layers,
        dim_mlp=integer(hf, "intermediate_size", "mlp"),
        dropout=number(hf, "embedding_dropout", 0.0, low=0.0, high=1.0),
        attn_dropout=number(hf, "attention_dropout", 0.0, low=0.0, high=1.0),
        norm="pre",
        activation="geglu",
        norm_eps=number(hf, "norm_eps", 1e-5, low=1e-30, high=1.0),
        bias=False,
        final_norm=True,
        backend=backend,
        local_window=window,
        global_every=_global_every(hf, n_layers),
        rope_theta=_theta(hf, GLOBAL, "global_rope_theta"),
        local_rope_theta=_theta(hf, LOCAL, "local_rope_theta"),
        first_attn_norm=False,
        vocab_size=vocab,
        max_positions=integer(hf, "max_position_embeddings", "positions", 8192),
        positions="rotary",
        type_vocab_size=0,
        pad_token_id=token_id(hf, "pad_token_id", 50283 if vocab > 50283 else None, vocab),
        position_offset=0,
        embedding_norm=True,
    )


def write_config(config: EncoderConfig) -> dict[str, Any]:
    shape = (config.norm, config.activation, config.positions, config.first_attn_norm)
    if shape != ("pre", "geglu", "rotary", False) or not config.use_final_norm or config.bias:
        raise CheckpointError(
            "a ModernBERT checkpoint needs norm='pre', activation='geglu', positions='rotary', "
            f"first_attn_norm=False, a final norm and bias=False, got {shape}, final_norm="
            f"{config.use_final_norm} and bias={config.bias}"
        )
    window = config.local_window if config.local_window is not None else config.max_positions
    local = config.local_rope_theta if config.local_rope_theta is not None else config.rope_theta
    kinds = [GLOBAL if t == "global" else LOCAL for t in config.layer_types]
    every = config.global_every if config.local_window is not None else 1
    return {
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "num_attention_heads": config.n_heads,
        "num_hidden_layers": config.n_layers,
        "intermediate_size": config.dim_mlp,
        "hidden_activation": "gelu",
        "max_position_embeddings": config.max_positions,
        "norm_eps": config.norm_eps,
        "norm_bias": False,
        "attention_bias": False,
        "mlp_bias": False,
        "embedding_dropout": config.dropout,
        "attention_dropout": config.dropout if config.attn_dropout is None else config.attn_dropout,
        "local_attention": window,
        "pad_token_id": config.pad_token_id,
        # Both spellings: transformers 5 reads the first two, earlier versions the others.
        "layer_types": kinds,
        "rope_parameters": {
            GLOBAL: {"rope_type": "default", "rope_theta": config.rope_theta},
            LOCAL: {"rope_type": "default", "rope_theta": local},
        },
        "global_attn_every_n_layers": every,
        "global_rope_theta": config.rope_theta,
        "local_rope_theta": local,
    }


def names(n_layers: int) -> NameTable:
    """Weights only: ModernBERT has no biases. ``Wqkv`` is stored as clearformer's fused
    ``in_proj`` already (rows q; k; v), so every entry maps one to one."""
    parts = [
        ("embeddings.word", "embeddings.tok_embeddings"),
        ("embeddings.norm", "embeddings.norm"),
    ]
    for i in range(n_layers):
        ours, theirs = f"encoder.layers.{i}", f"layers.{i}"
        if i > 0:  # layer 0 has no attention norm
            parts.append((f"{ours}.attn_norm", f"{theirs}.attn_norm"))
        parts += [
            (f"{ours}.attn.in_proj", f"{theirs}.attn.Wqkv"),
            (f"{ours}.attn.out_proj", f"{theirs}.attn.Wo"),
            (f"{ours}.mlp_norm", f"{theirs}.mlp_norm"),
            (f"{ours}.mlp.fc_in", f"{theirs}.mlp.Wi"),
            (f"{ours}.mlp.fc_out", f"{theirs}.mlp.Wo"),
        ]
    parts.append(("encoder.final_norm", "final_norm"))
    return [(f"{ours}.weight", (f"{theirs}.weight",)) for ours, theirs in parts]


def classifier(hf: dict[str, Any]) -> HeadLayout:
    """``ModernBertForSequenceClassification``: the first token or the mean of the real ones
    (``classifier_pooling``), then ``head`` (dense -> activation -> LayerNorm), then
    ``classifier``."""
    count, names = labels(hf)
    pooling = hf.get("classifier_pooling", "cls")
    if pooling not in ("cls", "mean"):
        raise CheckpointError(
            f"config.json 'classifier_pooling' must be 'cls' or 'mean', got {pooling!r}"
        )
    act = hf.get("classifier_activation", "gelu")
    if not isinstance(act, str) or act not in CLASSIFIER_ACTIVATIONS:
        raise CheckpointError(
            f"unsupported config.json 'classifier_activation'={act!r}; supported: "
            f"{', '.join(CLASSIFIER_ACTIVATIONS)}"
        )
    dense_bias, norm_bias = flag(hf, "classifier_bias", False), flag(hf, "norm_bias", False)
    config = ClassifierConfig(
        d_model=integer(hf, "hidden_size", "width"),
        num_labels=count,
        pooling=pooling,
        activation=act,
        dense_bias=dense_bias,
        norm=True,
        norm_eps=number(hf, "norm_eps", 1e-5, low=1e-30, high=1.0),
        norm_bias=norm_bias,
        labels=names,
    )
    table = head_names(
        "head.dense", "classifier", dense_bias=dense_bias, norm="head.norm", norm_bias=norm_bias
    )
    return HeadLayout(config, table)


def masked_lm(hf: dict[str, Any]) -> HeadLayout:
    """``ModernBertForMaskedLM``: ``head`` (dense -> activation -> LayerNorm), then a decoder
    tied to the token embeddings (its weight is not stored apart) with its own bias."""
    act = hf.get("classifier_activation", "gelu")
    if not isinstance(act, str) or act not in CLASSIFIER_ACTIVATIONS:
        raise CheckpointError(
            f"unsupported config.json 'classifier_activation'={act!r}; supported: "
            f"{', '.join(CLASSIFIER_ACTIVATIONS)}"
        )
    dense_bias = flag(hf, "classifier_bias", False)
    norm_bias = flag(hf, "norm_bias", False)
    decoder_bias = flag(hf, "decoder_bias", True)
    config = MaskedLMConfig(
        d_model=integer(hf, "hidden_size", "width"),
        vocab_size=integer(hf, "vocab_size", "vocab"),
        activation=act,
        dense_bias=dense_bias,
        norm_eps=number(hf, "norm_eps", 1e-5, low=1e-30, high=1.0),
        norm_bias=norm_bias,
        decoder_bias=decoder_bias,
    )
    names = [("dense.weight", ("head.dense.weight",)), ("norm.weight", ("head.norm.weight",))]
    if dense_bias:
        names.append(("dense.bias", ("head.dense.bias",)))
    if norm_bias:
        names.append(("norm.bias", ("head.norm.bias",)))
    if decoder_bias:
        names.append(("bias", ("decoder.bias",)))
    return HeadLayout(config, names)


MODERNBERT = Family(
    model_type="modernbert",
    hf_class="ModernBertModel",
    base_prefix="model.",
    unused_prefixes=("head.", "decoder.", "classifier.", "drop."),
    ignored_keys=(),
    read_config=read_config,
    write_config=write_config,
    names=names,
    # transformers' defaults for these ids lie outside small vocabularies; the model does not
    # use them, so a save without a base config leaves them unset.
    config_defaults={
        "bos_token_id": None,
        "eos_token_id": None,
        "cls_token_id": None,
        "sep_token_id": None,
    },
    classifier=classifier,
    masked_lm=masked_lm,
)
FAMILIES = (MODERNBERT,)
