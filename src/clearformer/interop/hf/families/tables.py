"""Name tables of BERT-family layouts, built from where each part of a block lives.

A name table lists, for every clearformer parameter, the Hugging Face tensors it is made of.
Most map one to one; the attention's fused ``in_proj`` stacks the query, key and value
projections (rows q; k; v), so it lists three sources. Loading concatenates them, saving splits
them: the same table serves both directions, so the two cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping

from .family import NameTable

# The block parts that are one Linear or LayerNorm each, in the order the table lists them.
LINEAR_PARTS = ("attn.out_proj", "attn_norm", "mlp.fc_in", "mlp.fc_out", "mlp_norm")


def linear(target: str, source: str) -> NameTable:
    """A Linear's or LayerNorm's weight and bias, one to one."""
    return [(f"{target}.weight", (f"{source}.weight",)), (f"{target}.bias", (f"{source}.bias",))]


def layered_names(n_layers: int, layer: Mapping[str, object], *, token_types: bool) -> NameTable:
    """The name table of an embeddings + ``n_layers`` blocks model laid out as ``layer`` says.

    Args:
        n_layers: blocks in the model.
        layer: ``"prefix"`` (the Hugging Face layers' key prefix), ``"qkv"`` (the query, key
            and value Linears, in that order) and one Hugging Face name per ``LINEAR_PARTS``
            entry, all relative to a layer.
        token_types: whether the embeddings have a token type table.
    """
    names: NameTable = [
        ("embeddings.word.weight", ("embeddings.word_embeddings.weight",)),
        ("embeddings.position.weight", ("embeddings.position_embeddings.weight",)),
    ]
    if token_types:
        names.append(("embeddings.token_type.weight", ("embeddings.token_type_embeddings.weight",)))
    names += linear("embeddings.norm", "embeddings.LayerNorm")
    for i in range(n_layers):
        ours, theirs = f"encoder.layers.{i}", f"{layer['prefix']}.{i}"
        qkv = [f"{theirs}.{part}" for part in layer["qkv"]]
        names += [
            (f"{ours}.attn.in_proj.weight", tuple(f"{n}.weight" for n in qkv)),
            (f"{ours}.attn.in_proj.bias", tuple(f"{n}.bias" for n in qkv)),
        ]
        for part in LINEAR_PARTS:
            names += linear(f"{ours}.{part}", f"{theirs}.{layer[part]}")
    return names


def head_names(
    dense: str, out: str, *, dense_bias: bool = True, norm: str | None = None, norm_bias=True
) -> NameTable:
    """The name table of a :class:`~clearformer.heads.SequenceClassifier` whose dense layer,
    optional LayerNorm and output layer are the checkpoint modules ``dense``, ``norm`` and
    ``out`` (full keys, task-model prefixes included)."""
    names: NameTable = [("dense.weight", (f"{dense}.weight",))]
    if dense_bias:
        names.append(("dense.bias", (f"{dense}.bias",)))
    if norm is not None:
        names.append(("norm.weight", (f"{norm}.weight",)))
        if norm_bias:
            names.append(("norm.bias", (f"{norm}.bias",)))
    return names + linear("out", out)
