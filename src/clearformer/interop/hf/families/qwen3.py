"""Qwen3 (Qwen3-Embedding, Qwen3-Reranker): transformers' ``Qwen3Model`` read as a causal
encoder stack.

The layout (:mod:`.decoder_layout`): pre-norm blocks with RMSNorm (weight times the normed
rows, ``rms_norm_eps``), grouped-query attention (``num_key_value_heads``) with its own head
width (``head_dim``: Qwen3-0.6B has 16 heads of 128 on a width of 1024), per-head RMSNorm of
queries and keys before rotate-half rotary positions (``rope_parameters['rope_theta']``),
SwiGLU, a final norm. Every query sees only the keys before it (``causal``): Qwen3-Embedding
pools the last token, which has read the whole text.

Rotary positions count each sequence's real tokens; transformers counts positions from the
first column whatever the padding, so with left padding its positions are shifted by the pad
count. Scores depend on distances only, so the two agree (to float rounding) either way.

Three ways to use a checkpoint: the base model (embeddings: ``Qwen3Model``, or the encoder of
any task model, under ``model.``), ``Qwen3ForSequenceClassification`` (the ``score`` row at the
last real token: :func:`classifier`), and ``Qwen3ForCausalLM`` as a reranker scored by
``logit('yes') - logit('no')`` (:mod:`clearformer.text.llm_reranker`).

Refused, naming the field: sliding-window layers (``use_sliding_window``, ``layer_types``),
scaled rotary positions, activations other than silu.
"""

from __future__ import annotations

from typing import Any

from ....config import EncoderConfig
from ....heads import ClassifierConfig
from ..files import CheckpointError
from .decoder_layout import attention_sizes, flag, layer_names, rope
from .family import Family, HeadLayout, NameTable
from .fields import labels, number, token_id


def read_config(hf: dict[str, Any], backend: str) -> EncoderConfig:
    sizes = attention_sizes(hf, head_dim_default=128)
    if flag(hf, "use_sliding_window", False):
        raise CheckpointError(
            "config.json 'use_sliding_window' must be false (Qwen3's sliding-window layers are "
            "not supported), got true"
        )
    types = hf.get("layer_types")
    if types is not None and (
        not isinstance(types, list) or any(t != "full_attention" for t in types)
    ):
        raise CheckpointError(
            f"config.json 'layer_types' must list only 'full_attention' layers (sliding-window "
            f"layers are not supported), got {types!r}"
        )
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise CheckpointError(
            f"config.json 'hidden_act' must be 'silu' (Qwen3's SwiGLU), got {act!r}"
        )
    return EncoderConfig(
        d_model=sizes["width"],
        n_heads=sizes["heads"],
        n_kv_heads=sizes["kv_heads"],
        head_dim=sizes["head_dim"],
        n_layers=sizes["layers"],
        dim_mlp=sizes["mlp"],
        dropout=0.0,
        attn_dropout=number(hf, "attention_dropout", 0.0, low=0.0, high=1.0),
        norm="pre",
        norm_kind="rms",
        norm_eps=number(hf, "rms_norm_eps", 1e-6, low=1e-30, high=1.0),
        activation="swiglu",
        bias=flag(hf, "attention_bias", False),
        qk_norm=True,
        causal=True,
        final_norm=True,
        backend=backend,
        positions="rotary",
        rope_theta=rope(hf, None, 10_000.0, "rope_theta"),
        vocab_size=sizes["vocab"],
        max_positions=sizes["positions"],
        type_vocab_size=0,
        pad_token_id=token_id(hf, "pad_token_id", None, sizes["vocab"]),
    )


def write_config(config: EncoderConfig) -> dict[str, Any]:
    shape = {
        "norm": (config.norm, "pre"),
        "norm_kind": (config.norm_kind, "rms"),
        "norm_unit_offset": (config.norm_unit_offset, False),
        "branch_norm": (config.branch_norm, False),
        "qk_norm": (config.qk_norm, True),
        "causal": (config.causal, True),
        "positions": (config.positions, "rotary"),
        "activation": (config.activation, "swiglu"),
        "final_norm": (config.use_final_norm, True),
        "embedding_norm": (config.embedding_norm, False),
        "scale_embeddings": (config.scale_embeddings, False),
        "type_vocab_size": (config.type_vocab_size, 0),
        "local layers": ("local" in config.layer_types, False),
        "attn_scale": (config.attn_scale in (None, config.head_width**-0.5), True),
    }
    wrong = {k: got for k, (got, want) in shape.items() if got != want}
    if wrong:
        raise CheckpointError(
            f"a Qwen3 checkpoint needs {', '.join(f'{k}={w!r}' for k, (_, w) in shape.items())}"
            f"; got {wrong}"
        )
    return {
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "intermediate_size": config.dim_mlp,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.kv_heads,
        "head_dim": config.head_width,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_positions,
        "rms_norm_eps": config.norm_eps,
        "attention_bias": config.bias,
        "attention_dropout": config.dropout if config.attn_dropout is None else config.attn_dropout,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
        "use_sliding_window": False,
        "layer_types": ["full_attention"] * config.n_layers,
        "pad_token_id": config.pad_token_id,
    }


def table(n_layers: int, bias: bool = False) -> NameTable:
    """The name table; ``bias``: config.json ``attention_bias`` (false in every published
    Qwen3)."""
    out: NameTable = [("embeddings.word.weight", ("embed_tokens.weight",))]
    for i in range(n_layers):
        out += layer_names(
            f"encoder.layers.{i}", f"layers.{i}", bias=bias, mlp_norm="post_attention_layernorm"
        )
    return out + [("encoder.final_norm.weight", ("norm.weight",))]


def config_names(config: EncoderConfig) -> NameTable:
    return table(config.n_layers, config.bias)


def classifier(hf: dict[str, Any]) -> HeadLayout:
    """``Qwen3ForSequenceClassification``: ``score`` (no bias) on the last real token's
    state. transformers finds that token as the last one that is not ``pad_token_id``;
    clearformer by the attention mask, which is the same unless a text ends in its pad
    token's id."""
    count, names = labels(hf)
    width = attention_sizes(hf, head_dim_default=128)["width"]
    config = ClassifierConfig(
        d_model=width,
        num_labels=count,
        pooling="lasttoken",
        dense=False,
        out_bias=False,
        labels=names,
    )
    return HeadLayout(config, [("out.weight", ("score.weight",))])


QWEN3 = Family(
    model_type="qwen3",
    hf_class="Qwen3Model",
    base_prefix="model.",
    unused_prefixes=("lm_head.", "score."),
    ignored_keys=(),
    read_config=read_config,
    write_config=write_config,
    names=table,
    config_defaults={"tie_word_embeddings": False},
    classifier=classifier,
    config_names=config_names,
)
FAMILIES = (QWEN3,)
