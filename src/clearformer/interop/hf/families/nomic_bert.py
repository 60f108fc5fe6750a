"""nomic-bert (nomic-embed-text-v1 and v1.5) as transformers 5 writes it (``model_type``
"nomic_bert", ``NomicBertModel``): the shared rotary-BERT layout of :mod:`.rotary_bert` with
no bias on any linear layer (its LayerNorms have them); SwiGLU (``hidden_act`` "silu"); rotary
base 1,000 by default; two token types.

Refused, naming the field: nomic-embed-text-v2's mixture-of-experts layers
(``moe_every_n_layers``, ``num_experts``), scaled rotary positions, a ``head_dim`` of its own,
and the remote-code spelling of the first releases (``n_embd``, ``n_layer``, ...).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from ....config import EncoderConfig
from ..files import CheckpointError
from .family import Family, NameTable
from .rotary_bert import names, read_config, write_config

# nomic-embed-text-v2-moe: every n-th layer's feed-forward is a mixture of experts.
_MOE_FIELDS = ("moe_every_n_layers", "num_experts", "moe_top_k")
# The remote-code config of the first releases, and what transformers 5 calls the field.
_LEGACY_FIELDS = {
    "n_embd": "hidden_size",
    "n_layer": "num_hidden_layers",
    "n_head": "num_attention_heads",
}


def _read(hf: dict[str, Any], backend: str) -> EncoderConfig:
    for key in _MOE_FIELDS:
        if hf.get(key) not in (None, 0):
            raise CheckpointError(
                f"config.json {key!r}={hf[key]!r}: mixture-of-experts layers "
                "(nomic-embed-text-v2-moe) are not supported; only dense nomic-bert layers"
            )
    legacy = [key for key in _LEGACY_FIELDS if key in hf]
    if legacy:
        raise CheckpointError(
            f"config.json uses nomic's remote-code field names {legacy} (for "
            f"{[_LEGACY_FIELDS[k] for k in legacy]}); load it once with transformers >= 5 "
            "(NomicBertModel.from_pretrained) and save_pretrained it to convert"
        )
    return read_config(hf, backend, theta=1_000.0, act="silu", pad=0, token_types=2, dropout=0.0)


def _names(n_layers: int) -> NameTable:
    return names(n_layers, token_types=True, gte=False)


def _config_names(config: EncoderConfig) -> NameTable:
    return names(config.n_layers, token_types=config.type_vocab_size > 0, gte=False)


NOMIC_BERT = Family(
    model_type="nomic_bert",
    hf_class="NomicBertModel",
    base_prefix="nomic_bert.",
    unused_prefixes=("pooler.", "cls.", "classifier."),
    ignored_keys=(),
    read_config=_read,
    write_config=partial(write_config, family="nomic_bert"),
    names=_names,
    kept_prefixes=("pooler.",),
    config_names=_config_names,
)
FAMILIES = (NOMIC_BERT,)
