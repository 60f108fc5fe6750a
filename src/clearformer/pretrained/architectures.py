"""BERT-family architectures: each one's config translation and parameter names.

A name table lists, for every clearformer parameter, the Hugging Face tensors it is made of.
Most map one to one; the attention's fused ``in_proj`` stacks the query, key and value
projections (rows q; k; v), so it lists three sources. Loading concatenates them, saving splits
them: the same table serves both directions, so the two cannot drift apart.

Numerics come from the checkpoint's own config: LayerNorm epsilon, the GELU variant, the
post-norm placement of every BERT-family block, and the LayerNorm on the embeddings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..config import EncoderConfig
from .checkpoint import CheckpointError

# Hugging Face activation names -> clearformer's. gelu_new / gelu_fast / gelu_pytorch_tanh are
# all the tanh approximation of GELU; plain "gelu" is the exact (erf) one.
ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "relu": "relu",
}

NameTable = list[tuple[str, tuple[str, ...]]]  # (clearformer name, Hugging Face sources)


@dataclass(frozen=True)
class Architecture:
    """How one Hugging Face architecture maps onto :class:`clearformer.EncoderModel`."""

    model_type: str  # config.json "model_type"
    hf_class: str  # the transformers class written into a saved config's "architectures"
    base_prefix: str  # key prefix of the encoder inside task models ("bert." in BertForMaskedLM)
    unused_prefixes: tuple[str, ...]  # task heads and pooler: reported, not loaded
    ignored_keys: tuple[str, ...]  # buffers some versions save (position ids): not weights

    def encoder_config(self, hf: dict[str, Any], backend: str = "auto") -> EncoderConfig:
        if self.model_type == "distilbert":
            return _distilbert_config(hf, backend)
        return _bert_config(hf, backend, roberta=self.model_type == "roberta")

    def hf_config(self, config: EncoderConfig, base: dict[str, Any] | None) -> dict[str, Any]:
        """A config.json for ``config`` (fields of ``base`` kept where they do not conflict)."""
        out = dict(base or {})
        out["model_type"] = self.model_type
        out["architectures"] = [self.hf_class]
        act = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}[config.activation]
        if self.model_type == "distilbert":
            out.update(
                vocab_size=config.vocab_size,
                dim=config.d_model,
                n_heads=config.n_heads,
                n_layers=config.n_layers,
                hidden_dim=config.dim_mlp,
                max_position_embeddings=config.max_positions,
                activation=act,
                dropout=config.dropout,
                attention_dropout=_attn_dropout(config),
                pad_token_id=config.pad_token_id,
            )
            out.setdefault("sinusoidal_pos_embds", False)
            return out
        out.update(
            vocab_size=config.vocab_size,
            hidden_size=config.d_model,
            num_attention_heads=config.n_heads,
            num_hidden_layers=config.n_layers,
            intermediate_size=config.dim_mlp,
            hidden_act=act,
            hidden_dropout_prob=config.dropout,
            attention_probs_dropout_prob=_attn_dropout(config),
            max_position_embeddings=config.max_positions,
            type_vocab_size=config.type_vocab_size,
            layer_norm_eps=config.norm_eps,
            pad_token_id=config.pad_token_id,
        )
        out.setdefault("position_embedding_type", "absolute")
        return out

    def name_table(self, n_layers: int) -> NameTable:
        if self.model_type == "distilbert":
            return _distilbert_names(n_layers)
        return _bert_names(n_layers, token_types=True)


def _attn_dropout(config: EncoderConfig) -> float:
    return config.dropout if config.attn_dropout is None else config.attn_dropout


ARCHITECTURES: dict[str, Architecture] = {
    "bert": Architecture(
        "bert",
        "BertModel",
        "bert.",
        ("pooler.", "cls.", "classifier.", "qa_outputs."),
        ("embeddings.position_ids", "embeddings.token_type_ids"),
    ),
    "roberta": Architecture(
        "roberta",
        "RobertaModel",
        "roberta.",
        ("pooler.", "lm_head.", "classifier.", "qa_outputs."),
        ("embeddings.position_ids", "embeddings.token_type_ids"),
    ),
    "distilbert": Architecture(
        "distilbert",
        "DistilBertModel",
        "distilbert.",
        (
            "vocab_transform.",
            "vocab_layer_norm.",
            "vocab_projector.",
            "pre_classifier.",
            "classifier.",
            "qa_outputs.",
        ),
        ("embeddings.position_ids",),
    ),
}


def architecture_for(hf: dict[str, Any], source: str = "config.json") -> Architecture:
    """The :class:`Architecture` named by a config's ``model_type``.

    Raises:
        CheckpointError: a missing or unsupported ``model_type``.
    """
    model_type = hf.get("model_type")
    if model_type not in ARCHITECTURES:
        raise CheckpointError(
            f"unsupported architecture model_type={model_type!r} in {source}; supported: "
            f"{', '.join(sorted(ARCHITECTURES))} (MiniLM checkpoints use 'bert')"
        )
    return ARCHITECTURES[model_type]


def _require(hf: dict[str, Any], key: str, kind: type = int) -> Any:
    if key not in hf:
        raise CheckpointError(f"config.json lacks {key!r}, needed for {hf.get('model_type')}")
    value = hf[key]
    if kind is int and (not isinstance(value, int) or isinstance(value, bool)):
        raise CheckpointError(f"config.json {key!r} must be an int, got {value!r}")
    return value


def _activation(name: Any, key: str) -> str:
    if name not in ACTIVATIONS:
        raise CheckpointError(
            f"unsupported activation {key}={name!r} in config.json; supported: "
            f"{', '.join(ACTIVATIONS)}"
        )
    return ACTIVATIONS[name]


def _bert_config(hf: dict[str, Any], backend: str, *, roberta: bool) -> EncoderConfig:
    position_type = hf.get("position_embedding_type", "absolute")
    if position_type != "absolute":
        raise CheckpointError(
            f"unsupported position_embedding_type={position_type!r} in config.json; "
            "only 'absolute' (learned) positions are supported"
        )
    if hf.get("is_decoder") or hf.get("add_cross_attention"):
        raise CheckpointError("config.json describes a decoder; only encoders are supported")
    pad = hf.get("pad_token_id", 1 if roberta else 0)
    if roberta and not isinstance(pad, int):
        raise CheckpointError(f"RoBERTa config.json needs an int pad_token_id, got {pad!r}")
    return EncoderConfig(
        d_model=_require(hf, "hidden_size"),
        n_heads=_require(hf, "num_attention_heads"),
        n_layers=_require(hf, "num_hidden_layers"),
        dim_mlp=_require(hf, "intermediate_size"),
        dropout=float(hf.get("hidden_dropout_prob", 0.1)),
        attn_dropout=float(hf.get("attention_probs_dropout_prob", 0.1)),
        norm="post",
        activation=_activation(hf.get("hidden_act", "gelu"), "hidden_act"),
        norm_eps=float(hf.get("layer_norm_eps", 1e-12)),
        final_norm=False,
        backend=backend,
        vocab_size=_require(hf, "vocab_size"),
        max_positions=_require(hf, "max_position_embeddings"),
        positions="learned",
        type_vocab_size=int(hf.get("type_vocab_size", 2)),
        pad_token_id=pad,
        # RoBERTa numbers positions from pad_token_id + 1 (rows up to the pad index are unused).
        position_offset=pad + 1 if roberta else 0,
        embedding_norm=True,
    )


def _distilbert_config(hf: dict[str, Any], backend: str) -> EncoderConfig:
    return EncoderConfig(
        d_model=_require(hf, "dim"),
        n_heads=_require(hf, "n_heads"),
        n_layers=_require(hf, "n_layers"),
        dim_mlp=_require(hf, "hidden_dim"),
        dropout=float(hf.get("dropout", 0.1)),
        attn_dropout=float(hf.get("attention_dropout", 0.1)),
        norm="post",
        activation=_activation(hf.get("activation", "gelu"), "activation"),
        norm_eps=1e-12,  # fixed in DistilBERT's code, not in its config
        final_norm=False,
        backend=backend,
        vocab_size=_require(hf, "vocab_size"),
        # Sinusoidal DistilBERT tables are stored as ordinary weights, so "learned" loads both.
        max_positions=_require(hf, "max_position_embeddings"),
        positions="learned",
        type_vocab_size=0,
        pad_token_id=hf.get("pad_token_id", 0),
        position_offset=0,
        embedding_norm=True,
    )


def _linear(target: str, source: str) -> NameTable:
    return [(f"{target}.weight", (f"{source}.weight",)), (f"{target}.bias", (f"{source}.bias",))]


# Where each part of a block lives in a Hugging Face layer, relative to the layer's prefix.
_BERT_LAYER = {
    "prefix": "encoder.layer",
    "qkv": ("attention.self.query", "attention.self.key", "attention.self.value"),
    "attn.out_proj": "attention.output.dense",
    "attn_norm": "attention.output.LayerNorm",
    "mlp.fc_in": "intermediate.dense",
    "mlp.fc_out": "output.dense",
    "mlp_norm": "output.LayerNorm",
}
_DISTILBERT_LAYER = {
    "prefix": "transformer.layer",
    "qkv": ("attention.q_lin", "attention.k_lin", "attention.v_lin"),
    "attn.out_proj": "attention.out_lin",
    "attn_norm": "sa_layer_norm",
    "mlp.fc_in": "ffn.lin1",
    "mlp.fc_out": "ffn.lin2",
    "mlp_norm": "output_layer_norm",
}
_LINEAR_PARTS = ("attn.out_proj", "attn_norm", "mlp.fc_in", "mlp.fc_out", "mlp_norm")


def _names(n_layers: int, layer: dict, *, token_types: bool) -> NameTable:
    """The name table of an embeddings + ``n_layers`` blocks model laid out as ``layer`` says."""
    names: NameTable = [
        ("embeddings.word.weight", ("embeddings.word_embeddings.weight",)),
        ("embeddings.position.weight", ("embeddings.position_embeddings.weight",)),
    ]
    if token_types:
        names.append(("embeddings.token_type.weight", ("embeddings.token_type_embeddings.weight",)))
    names += _linear("embeddings.norm", "embeddings.LayerNorm")
    for i in range(n_layers):
        ours, theirs = f"encoder.layers.{i}", f"{layer['prefix']}.{i}"
        qkv = [f"{theirs}.{part}" for part in layer["qkv"]]
        names += [
            (f"{ours}.attn.in_proj.weight", tuple(f"{n}.weight" for n in qkv)),
            (f"{ours}.attn.in_proj.bias", tuple(f"{n}.bias" for n in qkv)),
        ]
        for part in _LINEAR_PARTS:
            names += _linear(f"{ours}.{part}", f"{theirs}.{layer[part]}")
    return names


def _bert_names(n_layers: int, *, token_types: bool) -> NameTable:
    return _names(n_layers, _BERT_LAYER, token_types=token_types)


def _distilbert_names(n_layers: int) -> NameTable:
    return _names(n_layers, _DISTILBERT_LAYER, token_types=False)
