"""What Qwen3 and Gemma3 checkpoints share: the Llama-style layout of transformers' decoder
models, read as an encoder stack, and the config.json fields both spell the same way.

A layer: ``input_layernorm`` -> ``self_attn`` (``q_proj``, ``k_proj``, ``v_proj`` with fewer key
and value heads under grouped-query attention, per-head ``q_norm`` and ``k_norm``, ``o_proj``)
-> residual -> a norm -> ``mlp`` (``down_proj(act(gate_proj(x)) * up_proj(x))``) -> residual;
the stack ends in ``norm``. clearformer's ``in_proj`` stacks q; k; v rows (their sizes differ
under GQA, :func:`..mapping.row_split`), ``fc_in`` gate; up.
"""

from __future__ import annotations

from typing import Any

from ..files import CheckpointError
from .family import ZEROS, NameTable
from .fields import check_rope_scaling, check_size, integer


def attention_sizes(hf: dict[str, Any], head_dim_default: int) -> dict[str, int]:
    """The model's sizes, each checked: width, layers, heads, key/value heads, head width,
    feed-forward width, vocabulary, positions."""
    sizes = {
        "width": integer(hf, "hidden_size", "width"),
        "layers": integer(hf, "num_hidden_layers", "layers"),
        "heads": integer(hf, "num_attention_heads", "heads"),
        "mlp": integer(hf, "intermediate_size", "mlp"),
        "vocab": integer(hf, "vocab_size", "vocab"),
        "positions": integer(hf, "max_position_embeddings", "positions", 32_768),
    }
    sizes["kv_heads"] = integer(hf, "num_key_value_heads", "heads", sizes["heads"])
    sizes["head_dim"] = integer(hf, "head_dim", "heads", head_dim_default)
    if sizes["heads"] % sizes["kv_heads"]:
        raise CheckpointError(
            f"config.json 'num_key_value_heads'={sizes['kv_heads']} must divide "
            f"'num_attention_heads'={sizes['heads']} (each key/value head serves a group)"
        )
    if sizes["head_dim"] % 2:
        raise CheckpointError(
            f"config.json 'head_dim'={sizes['head_dim']} must be even for rotary positions"
        )
    # The attention may be wider than the model (Qwen3-0.6B: 16 heads of 128 on width 1024);
    # check_size bounds the total with the larger of the two.
    inner = max(sizes["width"], sizes["heads"] * sizes["head_dim"])
    check_size(
        width=inner,
        layers=sizes["layers"],
        mlp=sizes["mlp"],
        vocab=sizes["vocab"],
        positions=0,
        token_types=0,
    )
    return sizes


def flag(hf: dict[str, Any], key: str, default: bool) -> bool:
    value = hf.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise CheckpointError(f"config.json {key!r} must be true or false, got {value!r}")
    return value


def layer_names(
    ours: str,
    theirs: str,
    *,
    bias: bool,
    mlp_norm: str,
    branch_norms: tuple[str, str] | None = None,
) -> NameTable:
    """One layer's name table. ``bias``: the attention's projections have biases (config.json
    ``attention_bias``; the feed-forward never has: its biases are ZEROS then). ``mlp_norm``:
    the checkpoint's norm before the feed-forward; ``branch_norms``: Gemma3's norms after the
    attention and after the feed-forward."""
    attn, mlp = f"{theirs}.self_attn", f"{theirs}.mlp"
    qkv = [f"{attn}.{p}_proj" for p in "qkv"]
    table: NameTable = [
        (f"{ours}.attn_norm.weight", (f"{theirs}.input_layernorm.weight",)),
        (f"{ours}.attn.in_proj.weight", tuple(f"{n}.weight" for n in qkv)),
        (f"{ours}.attn.out_proj.weight", (f"{attn}.o_proj.weight",)),
        (f"{ours}.attn.q_norm.weight", (f"{attn}.q_norm.weight",)),
        (f"{ours}.attn.k_norm.weight", (f"{attn}.k_norm.weight",)),
        (f"{ours}.mlp_norm.weight", (f"{theirs}.{mlp_norm}.weight",)),
        (f"{ours}.mlp.fc_in.weight", (f"{mlp}.gate_proj.weight", f"{mlp}.up_proj.weight")),
        (f"{ours}.mlp.fc_out.weight", (f"{mlp}.down_proj.weight",)),
    ]
    if bias:
        table += [
            (f"{ours}.attn.in_proj.bias", tuple(f"{n}.bias" for n in qkv)),
            (f"{ours}.attn.out_proj.bias", (f"{attn}.o_proj.bias",)),
            (f"{ours}.mlp.fc_in.bias", ZEROS),
            (f"{ours}.mlp.fc_out.bias", ZEROS),
        ]
    if branch_norms is not None:
        after_attn, after_mlp = branch_norms
        table += [
            (f"{ours}.attn_out_norm.weight", (f"{theirs}.{after_attn}.weight",)),
            (f"{ours}.mlp_out_norm.weight", (f"{theirs}.{after_mlp}.weight",)),
        ]
    return table


def rope(hf: dict[str, Any], kind: str | None, default: float, legacy: str) -> float:
    """The rotary base of a layer kind: ``rope_parameters[kind]['rope_theta']`` (or
    ``rope_parameters['rope_theta']`` for one kind, None), else the legacy field; plain
    rotary positions only."""
    params = hf.get("rope_parameters") or {}
    if not isinstance(params, dict):
        raise CheckpointError(f"config.json 'rope_parameters' must be an object, got {params!r}")
    entry = (params.get(kind) or {}) if kind is not None else params
    where = f"rope_parameters[{kind!r}]" if kind is not None else "rope_parameters"
    rope_type = entry.get("rope_type", "default")
    if rope_type != "default":
        raise CheckpointError(
            f"config.json {where}['rope_type'] must be 'default' (scaled rotary positions such "
            f"as YaRN are not supported), got {rope_type!r}"
        )
    check_rope_scaling(hf)
    source = f"{where}['rope_theta']" if "rope_theta" in entry else legacy
    value = entry.get("rope_theta", hf.get(legacy, default))
    if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
        raise CheckpointError(f"config.json {source} must be a number > 0, got {value!r}")
    return float(value)
