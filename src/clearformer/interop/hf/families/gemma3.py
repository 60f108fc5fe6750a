"""Gemma3 text (EmbeddingGemma): transformers' ``Gemma3TextModel`` (``model_type``
"gemma3_text") read as an encoder stack, bidirectional when ``use_bidirectional_attention``.

The layout (:mod:`.decoder_layout`), and what Gemma adds:

* token embeddings times sqrt(hidden_size), the factor rounded to the table's dtype;
* RMSNorm scaled by ``1 + weight`` (Gemma stores offsets from one), computed in float32;
* four norms a block: ``input_layernorm`` before the attention, ``post_attention_layernorm``
  on its output before the residual add, ``pre_feedforward_layernorm`` and
  ``post_feedforward_layernorm`` around the feed-forward;
* grouped-query attention with per-head q/k norms, scores scaled by
  ``query_pre_attn_scalar ** -0.5`` rather than the head width's;
* GeGLU with the tanh GELU (``hidden_activation`` "gelu_pytorch_tanh");
* ``layer_types``: sliding-window and global layers (five to one), each kind with its own
  rotary base (``rope_parameters``: sliding 10,000, full 1,000,000). ``sliding_window`` is
  config.json's value: bidirectional, a query sees ``sliding_window // 2`` keys on each side
  (transformers turns the saved 512 into an exclusive bound of 257); causal, the
  ``sliding_window`` most recent keys.

EmbeddingGemma's sentence-transformers stack (Pooling mean -> Dense 768->3072 -> Dense
3072->768 -> Normalize, with prompts) is read by :mod:`..st_modules`.

Refused, naming the field: attention logit soft-capping (``attn_logit_softcapping``), scaled
rotary positions, activations other than gelu_pytorch_tanh, local layers without a
``sliding_window``.
"""

from __future__ import annotations

from typing import Any

from ....config import EncoderConfig
from ..files import CheckpointError
from .decoder_layout import attention_sizes, flag, layer_names, rope
from .family import Family, NameTable
from .fields import integer, number, token_id

KINDS = {"sliding_attention": "local", "full_attention": "global"}
SAVED_KINDS = {value: key for key, value in KINDS.items()}


def _layer_pattern(hf: dict[str, Any], n_layers: int) -> tuple[str, ...]:
    types = hf.get("layer_types")
    if types is None:  # transformers' default: every sixth layer global
        every = integer(hf, "sliding_window_pattern", "layers", 6)
        return tuple("global" if (i + 1) % every == 0 else "local" for i in range(n_layers))
    if not isinstance(types, list) or len(types) != n_layers or set(types) - set(KINDS):
        raise CheckpointError(
            f"config.json 'layer_types' must list {n_layers} of {sorted(KINDS)}, got {types!r}"
        )
    return tuple(KINDS[t] for t in types)


def read_config(hf: dict[str, Any], backend: str) -> EncoderConfig:
    sizes = attention_sizes(hf, head_dim_default=256)
    if hf.get("attn_logit_softcapping") is not None:
        raise CheckpointError(
            "config.json 'attn_logit_softcapping' must be null (soft-capped attention scores "
            f"are not supported), got {hf['attn_logit_softcapping']!r}"
        )
    act = hf.get("hidden_activation", hf.get("hidden_act", "gelu_pytorch_tanh"))
    if act != "gelu_pytorch_tanh":
        raise CheckpointError(
            f"config.json 'hidden_activation' must be 'gelu_pytorch_tanh' (Gemma's GeGLU), "
            f"got {act!r}"
        )
    pattern = _layer_pattern(hf, sizes["layers"])
    window = hf.get("sliding_window")
    if "local" in pattern or window is not None:
        window = integer(hf, "sliding_window", "positions")
    scalar = number(hf, "query_pre_attn_scalar", 256, low=1e-30, high=1e12)
    return EncoderConfig(
        d_model=sizes["width"],
        n_heads=sizes["heads"],
        n_kv_heads=sizes["kv_heads"],
        head_dim=sizes["head_dim"],
        attn_scale=scalar**-0.5,
        n_layers=sizes["layers"],
        dim_mlp=sizes["mlp"],
        dropout=0.0,
        attn_dropout=number(hf, "attention_dropout", 0.0, low=0.0, high=1.0),
        norm="pre",
        norm_kind="rms",
        norm_unit_offset=True,
        branch_norm=True,
        norm_eps=number(hf, "rms_norm_eps", 1e-6, low=1e-30, high=1.0),
        activation="geglu_tanh",
        bias=flag(hf, "attention_bias", False),
        qk_norm=True,
        causal=not flag(hf, "use_bidirectional_attention", False),
        final_norm=True,
        backend=backend,
        local_window=window,
        layer_pattern=pattern,
        positions="rotary",
        rope_theta=rope(hf, "full_attention", 1_000_000.0, "rope_theta"),
        local_rope_theta=rope(hf, "sliding_attention", 10_000.0, "rope_local_base_freq"),
        vocab_size=sizes["vocab"],
        max_positions=sizes["positions"],
        type_vocab_size=0,
        pad_token_id=token_id(hf, "pad_token_id", 0, sizes["vocab"]),
        scale_embeddings=True,
    )


def write_config(config: EncoderConfig) -> dict[str, Any]:
    scalar = None if config.attn_scale is None else round(config.attn_scale**-2)
    shape = {
        "norm": (config.norm, "pre"),
        "norm_kind": (config.norm_kind, "rms"),
        "norm_unit_offset": (config.norm_unit_offset, True),
        "branch_norm": (config.branch_norm, True),
        "qk_norm": (config.qk_norm, True),
        "positions": (config.positions, "rotary"),
        "activation": (config.activation, "geglu_tanh"),
        "final_norm": (config.use_final_norm, True),
        "embedding_norm": (config.embedding_norm, False),
        "scale_embeddings": (config.scale_embeddings, True),
        "type_vocab_size": (config.type_vocab_size, 0),
        # query_pre_attn_scalar is an int: the scale must be one's inverse square root.
        "attn_scale": (scalar is not None and abs(scalar**-0.5 - config.attn_scale) < 1e-9, True),
    }
    wrong = {k: got for k, (got, want) in shape.items() if got != want}
    if wrong:
        raise CheckpointError(
            "a Gemma3 checkpoint needs "
            f"{', '.join(f'{k}={w!r}' for k, (_, w) in shape.items())}; got {wrong}"
        )
    local = config.local_rope_theta if config.local_rope_theta is not None else config.rope_theta
    fields = {
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "intermediate_size": config.dim_mlp,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.kv_heads,
        "head_dim": config.head_width,
        "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": config.max_positions,
        "rms_norm_eps": config.norm_eps,
        "attention_bias": config.bias,
        "attention_dropout": config.dropout if config.attn_dropout is None else config.attn_dropout,
        "query_pre_attn_scalar": scalar,
        "layer_types": [SAVED_KINDS[t] for t in config.layer_types],
        "use_bidirectional_attention": not config.causal,
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": config.rope_theta},
            "sliding_attention": {"rope_type": "default", "rope_theta": local},
        },
        "attn_logit_softcapping": None,
        "pad_token_id": config.pad_token_id,
    }
    if config.local_window is not None:
        fields["sliding_window"] = config.local_window
    return fields


def table(n_layers: int, bias: bool = False) -> NameTable:
    """The name table; ``bias``: config.json ``attention_bias`` (false in every published
    Gemma3)."""
    out: NameTable = [("embeddings.word.weight", ("embed_tokens.weight",))]
    for i in range(n_layers):
        out += layer_names(
            f"encoder.layers.{i}",
            f"layers.{i}",
            bias=bias,
            mlp_norm="pre_feedforward_layernorm",
            branch_norms=("post_attention_layernorm", "post_feedforward_layernorm"),
        )
    return out + [("encoder.final_norm.weight", ("norm.weight",))]


def config_names(config: EncoderConfig) -> NameTable:
    return table(config.n_layers, config.bias)


GEMMA3_TEXT = Family(
    model_type="gemma3_text",
    hf_class="Gemma3TextModel",
    base_prefix="model.",
    unused_prefixes=("lm_head.",),
    ignored_keys=(),
    read_config=read_config,
    write_config=write_config,
    names=table,
    config_names=config_names,
)
FAMILIES = (GEMMA3_TEXT,)
