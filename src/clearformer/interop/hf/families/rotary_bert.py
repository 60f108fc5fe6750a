"""The layout GTE and nomic-bert share in transformers 5: a BERT with rotary positions and a
gated feed-forward, written as transformers' ``GteModel`` and ``NomicBertModel`` build it.

* embeddings: word (+ token type) -> LayerNorm -> dropout; no position table;
* post-norm blocks: ``x = post_attention_layernorm(x + attention(x))``, then
  ``x = post_mlp_layernorm(x + mlp(x))``; no final norm;
* attention: separate ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``; rotate-half rotary
  positions over the whole head width, base ``rope_parameters['rope_theta']``;
* feed-forward: ``down_proj(act(gate_proj(x)) * up_proj(x))``, GeGLU for ``hidden_act``
  "gelu", SwiGLU for "silu". clearformer's ``fc_in`` stacks the gate rows, then the up rows.

transformers 5 runs these under its own names (``layers.{i}.self_attn.q_proj``, ...) but saves
them under the checkpoints' original ones, which the hub's files use too: GTE's
``encoder.layer.{i}.attention.qkv_proj``, ``attn_ln``, ``mlp.up_gate_proj`` (rows up; gate),
``mlp_ln``; nomic's ``emb_ln``, ``encoder.layers.{i}.attn.Wqkv``, ``mlp.fc11`` (up), ``fc12``
(gate), ``fc2``, ``norm1``, ``norm2``. The name tables map those, both ways.

What differs is which linear layers have biases (GTE: all but ``gate_proj`` and ``up_proj``;
nomic: none, only its LayerNorms). clearformer's ``bias`` is one switch for every linear layer
and norm, so a bias the checkpoint lacks loads as zeros (:data:`~.family.ZEROS`): the same
arithmetic, and a save writes it only back as absent, refusing it once training has moved it.

Rotary positions count each sequence's real tokens; transformers counts from the first
position whatever the padding. Scores depend on the distance between positions only, so the
two agree on either padding side (to float rounding).

Dropout sits where clearformer's blocks put it (after attention and the feed-forward network),
not inside GTE's gated activation: inference is identical, training differs slightly.

Configs that transformers 5 writes are read; the remote-code configs these models first shipped
with (nomic's ``n_embd``, ``n_layer``; GTE's ``model_type`` "new") are not: load such a model
once with transformers 5 and ``save_pretrained`` it.
"""

from __future__ import annotations

from typing import Any

from ....config import EncoderConfig
from ..files import CheckpointError
from .family import ZEROS, NameTable
from .fields import (
    attn_dropout,
    check_heads,
    check_rope_scaling,
    check_size,
    integer,
    number,
    token_id,
)
from .tables import linear

# transformers' hidden_act of the gate -> clearformer's gated activation.
GATED = {"gelu": "geglu", "silu": "swiglu", "swish": "swiglu"}
SAVED_GATED = {"geglu": "gelu", "swiglu": "silu"}


def rope_theta(hf: dict[str, Any], default: float) -> float:
    """The rotary base: ``rope_parameters['rope_theta']`` (transformers 5) or ``rope_theta``;
    only plain rotary positions (``rope_type`` "default", and a ``rope_scaling``, if any, of
    type "default")."""
    params = hf.get("rope_parameters") or {}
    if not isinstance(params, dict):
        raise CheckpointError(f"config.json 'rope_parameters' must be an object, got {params!r}")
    kind = params.get("rope_type", "default")
    if kind != "default":
        raise CheckpointError(
            f"config.json rope_parameters['rope_type'] must be 'default' (scaled rotary "
            f"positions such as NTK are not supported), got {kind!r}"
        )
    check_rope_scaling(hf)
    source = "rope_parameters['rope_theta']" if "rope_theta" in params else "rope_theta"
    value = params.get("rope_theta", hf.get("rope_theta", default))
    if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
        raise CheckpointError(f"config.json {source} must be a number > 0, got {value!r}")
    return float(value)


def read_config(
    hf: dict[str, Any],
    backend: str,
    *,
    theta: float,
    act: str,
    pad: int | None,
    token_types: int,
    dropout: float,
) -> EncoderConfig:
    """The :class:`EncoderConfig` of a transformers 5 GTE or nomic-bert config.json; the
    keyword arguments are the family's defaults for fields a config leaves out."""
    sizes = {
        "width": integer(hf, "hidden_size", "width"),
        "layers": integer(hf, "num_hidden_layers", "layers"),
        "mlp": integer(hf, "intermediate_size", "mlp"),
        "vocab": integer(hf, "vocab_size", "vocab"),
        "positions": integer(hf, "max_position_embeddings", "positions"),
        "token_types": integer(hf, "type_vocab_size", "token_types", default=token_types),
    }
    heads = integer(hf, "num_attention_heads", "heads")
    check_heads(hf, "hidden_size", "num_attention_heads")
    check_size(**sizes)
    head_dim = hf.get("head_dim")
    if head_dim is not None and head_dim != sizes["width"] // heads:
        raise CheckpointError(
            f"config.json 'head_dim' must be hidden_size / num_attention_heads = "
            f"{sizes['width'] // heads} (a head width of its own is not supported), got "
            f"{head_dim!r}"
        )
    if (sizes["width"] // heads) % 2:
        raise CheckpointError(
            f"config.json 'hidden_size' / 'num_attention_heads' = {sizes['width'] // heads} "
            "must be even for rotary positions"
        )
    name = hf.get("hidden_act", act)
    if not isinstance(name, str) or name not in GATED:
        raise CheckpointError(
            f"unsupported config.json 'hidden_act'={name!r} for a gated feed-forward; "
            f"supported: {', '.join(GATED)}"
        )
    return EncoderConfig(
        d_model=sizes["width"],
        n_heads=heads,
        n_layers=sizes["layers"],
        dim_mlp=sizes["mlp"],
        dropout=number(hf, "hidden_dropout_prob", dropout, low=0.0, high=1.0),
        attn_dropout=number(hf, "attention_probs_dropout_prob", 0.0, low=0.0, high=1.0),
        norm="post",
        activation=GATED[name],
        norm_eps=number(hf, "layer_norm_eps", 1e-12, low=1e-30, high=1.0),
        final_norm=False,
        backend=backend,
        rope_theta=rope_theta(hf, theta),
        vocab_size=sizes["vocab"],
        max_positions=sizes["positions"],
        positions="rotary",
        type_vocab_size=sizes["token_types"],
        pad_token_id=token_id(hf, "pad_token_id", pad, sizes["vocab"]),
        embedding_norm=True,
    )


def write_config(config: EncoderConfig, *, family: str) -> dict[str, Any]:
    """The config.json fields of ``config`` as a transformers 5 GTE or nomic-bert."""
    shape = (config.norm, config.positions, config.use_final_norm, config.embedding_norm)
    others = (
        config.local_window,
        config.relative_attention_buckets,
        config.position_offset,
        config.first_attn_norm,
        config.bias,
    )
    if (
        shape != ("post", "rotary", False, True)
        or config.activation not in SAVED_GATED
        or others != (None, 0, 0, True, True)
    ):
        raise CheckpointError(
            f"a {family} checkpoint needs norm='post', positions='rotary', no final norm, an "
            "embedding norm, a gated activation (geglu or swiglu), global attention, "
            f"position_offset=0 and bias=True; got norm={config.norm!r}, positions="
            f"{config.positions!r}, activation={config.activation!r}, final_norm="
            f"{config.use_final_norm}, embedding_norm={config.embedding_norm}, local_window="
            f"{config.local_window}, bias={config.bias}"
        )
    return {
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "head_dim": config.d_model // config.n_heads,
        "intermediate_size": config.dim_mlp,
        "hidden_act": SAVED_GATED[config.activation],
        "hidden_dropout_prob": config.dropout,
        "attention_probs_dropout_prob": attn_dropout(config),
        "max_position_embeddings": config.max_positions,
        "type_vocab_size": config.type_vocab_size,
        "layer_norm_eps": config.norm_eps,
        "pad_token_id": config.pad_token_id,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
    }


def names(n_layers: int, *, token_types: bool, gte: bool) -> NameTable:
    """The name table of the layout as transformers 5 saves it (the checkpoints' own names,
    which its loader renames on the way in; the keys in :mod:`.gte`, :mod:`.nomic_bert`)."""
    table: NameTable = [("embeddings.word.weight", ("embeddings.word_embeddings.weight",))]
    if token_types:
        table.append(("embeddings.token_type.weight", ("embeddings.token_type_embeddings.weight",)))
    table += linear("embeddings.norm", "embeddings.LayerNorm" if gte else "emb_ln")
    for i in range(n_layers):
        ours = f"encoder.layers.{i}"
        table += (_gte_layer if gte else _nomic_layer)(ours, i)
    return table


def _gte_layer(ours: str, i: int) -> NameTable:
    """GTE: biases everywhere but the fused ``up_gate_proj`` (rows up; gate, so clearformer's
    gate; up takes its second half first)."""
    theirs = f"encoder.layer.{i}"
    attn, mlp = f"{theirs}.attention", f"{theirs}.mlp"
    up_gate = f"{mlp}.up_gate_proj.weight"
    return [
        *linear(f"{ours}.attn.in_proj", f"{attn}.qkv_proj"),
        *linear(f"{ours}.attn.out_proj", f"{attn}.o_proj"),
        *linear(f"{ours}.attn_norm", f"{theirs}.attn_ln"),
        (f"{ours}.mlp.fc_in.weight", (f"{up_gate}#1/2", f"{up_gate}#0/2")),
        (f"{ours}.mlp.fc_in.bias", ZEROS),
        *linear(f"{ours}.mlp.fc_out", f"{mlp}.down_proj"),
        *linear(f"{ours}.mlp_norm", f"{theirs}.mlp_ln"),
    ]


def _nomic_layer(ours: str, i: int) -> NameTable:
    """nomic-bert: no linear biases; ``fc11`` is the up projection, ``fc12`` the gate."""
    theirs = f"encoder.layers.{i}"
    attn, mlp = f"{theirs}.attn", f"{theirs}.mlp"
    return [
        (f"{ours}.attn.in_proj.weight", (f"{attn}.Wqkv.weight",)),
        (f"{ours}.attn.in_proj.bias", ZEROS),
        (f"{ours}.attn.out_proj.weight", (f"{attn}.out_proj.weight",)),
        (f"{ours}.attn.out_proj.bias", ZEROS),
        *linear(f"{ours}.attn_norm", f"{theirs}.norm1"),
        (f"{ours}.mlp.fc_in.weight", (f"{mlp}.fc12.weight", f"{mlp}.fc11.weight")),
        (f"{ours}.mlp.fc_in.bias", ZEROS),
        (f"{ours}.mlp.fc_out.weight", (f"{mlp}.fc2.weight",)),
        (f"{ours}.mlp.fc_out.bias", ZEROS),
        *linear(f"{ours}.mlp_norm", f"{theirs}.norm2"),
    ]
