"""What a checkpoint family tells the loader: a :class:`Family` describes one ``model_type``.

A family translates its config.json to an :class:`~clearformer.EncoderConfig` and back, and
lists in a name table, for every clearformer parameter, the Hugging Face tensors it is made
of. The loader (:mod:`..mapping`, :mod:`..loading`) runs on these answers alone, so a new
family is a new module that builds a :class:`Family` and registers it (see
:mod:`clearformer.interop.hf.families`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ....config import EncoderConfig
from ....heads import ClassifierConfig, MaskedLMConfig

# (clearformer parameter name, its Hugging Face sources). One source maps one to one; several
# are stacked along the first axis, in order, to make the parameter (the fused q; k; v rows).
# A source ending in "#k/n" is the k-th of n equal row blocks of that tensor (GTE's fused
# up_gate_proj is up; gate, clearformer's fc_in gate; up). No source (ZEROS) is a parameter the
# layout lacks, a bias the family's checkpoints do not have: it loads as zeros (so the same
# arithmetic runs), and a save refuses it unless it is still all zeros.
NameTable = list[tuple[str, tuple[str, ...]]]
ZEROS: tuple[str, ...] = ()


@dataclass(frozen=True)
class HeadLayout:
    """Where a checkpoint keeps a head: its config and, for each head parameter, the full
    checkpoint keys it is made of (task-model prefixes included, as ``bert.pooler.dense``)."""

    config: ClassifierConfig | MaskedLMConfig
    names: NameTable


@dataclass(frozen=True)
class Family:
    """How one Hugging Face ``model_type`` maps onto :class:`clearformer.EncoderModel`.

    Attributes:
        model_type: config.json's ``"model_type"``.
        hf_class: the transformers class a saved config names in ``"architectures"``.
        base_prefix: key prefix of the encoder inside task models (``"bert."`` in
            ``BertForMaskedLM``); keys without it are read as a bare base model's.
        unused_prefixes: task heads and pooler: reported, not loaded.
        ignored_keys: buffers some versions save (position ids): not weights.
        read_config: ``(config.json dict, backend) -> EncoderConfig``; raises CheckpointError
            for what the family cannot run.
        write_config: ``EncoderConfig -> {config.json field: value}``, the fields the config
            determines; raises CheckpointError for what the family cannot express.
        names: ``n_layers -> NameTable``.
        config_defaults: config.json fields written only where the base config lacks them.
        kept_prefixes: unused base-model tensors (the pooler) a load hands back so that a save
            writes them again: transformers' base model has them, clearformer does not run them.
        classifier: ``config.json dict -> HeadLayout`` of the family's
            ``*ForSequenceClassification`` head; None = the family has none in clearformer.
            Its tensors must be among ``unused_prefixes``, so a plain load reports them unused.
        masked_lm: ``config.json dict -> HeadLayout`` of the family's ``*ForMaskedLM`` head
            (a :class:`~clearformer.heads.MaskedLMConfig`); None = none in clearformer.
        config_names: ``EncoderConfig -> NameTable`` for a family whose layout depends on more
            than the depth (GTE has a token type table or none); None = ``names``.
    """

    model_type: str
    hf_class: str
    base_prefix: str
    unused_prefixes: tuple[str, ...]
    ignored_keys: tuple[str, ...]
    read_config: Callable[[dict[str, Any], str], EncoderConfig]
    write_config: Callable[[EncoderConfig], dict[str, Any]]
    names: Callable[[int], NameTable]
    config_defaults: Mapping[str, Any] = field(default_factory=dict)
    kept_prefixes: tuple[str, ...] = ()
    classifier: Callable[[dict[str, Any]], HeadLayout] | None = None
    masked_lm: Callable[[dict[str, Any]], HeadLayout] | None = None
    config_names: Callable[[EncoderConfig], NameTable] | None = None

    def encoder_config(self, hf: dict[str, Any], backend: str = "auto") -> EncoderConfig:
        """The :class:`EncoderConfig` of a config.json of this family."""
        return self.read_config(hf, backend)

    def hf_config(self, config: EncoderConfig, base: dict[str, Any] | None) -> dict[str, Any]:
        """A config.json for ``config`` (fields of ``base`` kept where they do not conflict)."""
        fields = self.write_config(config)  # first: an inexpressible config raises early
        out = dict(base or {})
        out["model_type"] = self.model_type
        out["architectures"] = [self.hf_class]
        out.update(fields)
        for key, value in self.config_defaults.items():
            out.setdefault(key, value)
        return out

    def name_table(self, n_layers: int, config: EncoderConfig | None = None) -> NameTable:
        """The name table of a model of ``n_layers`` blocks (``config``: the model's, for a
        family with :attr:`config_names`)."""
        if self.config_names is not None and config is not None:
            return self.config_names(config)
        return self.names(n_layers)
