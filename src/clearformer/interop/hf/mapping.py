"""Hugging Face state dicts <-> :class:`clearformer.EncoderModel`, strictly and shape-checked.

Loading walks the family's name table (see :mod:`.families`): every clearformer
parameter must find its sources, every source must have the shape the config implies, and
every checkpoint key must be used, be a known task head or pooler (reported, not loaded), or be
a known buffer. Anything else is an error unless ``strict=False``, which reports it instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from ...model import EncoderModel
from .families import Family
from .files import CheckpointError

# Checkpoints converted from TensorFlow name LayerNorm parameters gamma / beta.
_LEGACY_SUFFIXES = {".gamma": ".weight", ".beta": ".bias"}


@dataclass
class LoadReport:
    """What a load did: which tensors went where, and which keys did not map."""

    source: str
    architecture: str
    loaded: list[str] = field(default_factory=list)  # clearformer parameters filled
    unused: list[str] = field(default_factory=list)  # pooler / task heads, not part of the model
    ignored: list[str] = field(default_factory=list)  # buffers such as position ids
    unexpected: list[str] = field(default_factory=list)  # keys that map to nothing
    missing: list[str] = field(default_factory=list)  # checkpoint keys the model needs, absent

    @property
    def complete(self) -> bool:
        return not self.unexpected and not self.missing

    def __str__(self) -> str:
        lines = [
            f"{self.source}: {self.architecture}, {len(self.loaded)} parameters loaded",
        ]
        for label, names in (
            ("not used (pooler / task heads)", self.unused),
            ("ignored buffers", self.ignored),
            ("unexpected keys", self.unexpected),
            ("missing keys", self.missing),
        ):
            if names:
                shown = ", ".join(names[:6]) + (
                    f", ... ({len(names)} in all)" if len(names) > 6 else ""
                )
                lines.append(f"  {label}: {shown}")
        return "\n".join(lines)


def _normalise_keys(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    out = {}
    for key, value in tensors.items():
        for old, new in _LEGACY_SUFFIXES.items():
            if key.endswith(old) and "LayerNorm" in key:
                key = key[: -len(old)] + new
        out[key] = value
    return out


def _split_prefix(
    tensors: dict[str, Tensor], family: Family
) -> tuple[dict[str, Tensor], dict[str, Tensor], str]:
    """(encoder keys with a task model's prefix removed, keys outside the encoder, prefix)."""
    prefix = family.base_prefix
    if not any(k.startswith(prefix) for k in tensors):
        return tensors, {}, ""
    inner = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
    outer = {k: v for k, v in tensors.items() if not k.startswith(prefix)}
    return inner, outer, prefix


def load_state(
    model: EncoderModel,
    tensors: dict[str, Tensor],
    family: Family,
    *,
    strict: bool = True,
    source: str = "checkpoint",
) -> tuple[LoadReport, dict[str, Tensor]]:
    """Copy a Hugging Face state dict into ``model``.

    Returns:
        The report, and the base-model tensors that clearformer does not run (the pooler), so a
        save can write them back.

    Raises:
        CheckpointError: a tensor of the wrong shape (always); with ``strict``, also missing or
            unexpected keys. Shapes are all checked before any parameter is written.
    """
    report = LoadReport(source=source, architecture=family.model_type)
    inner, outer, prefix = _split_prefix(_normalise_keys(tensors), family)
    params = dict(model.named_parameters())
    table = family.name_table(model.config.n_layers)
    if {t for t, _ in table} != set(params):
        raise CheckpointError(
            f"internal name table for {family.model_type} does not cover the model: "
            f"{sorted(set(params) ^ {t for t, _ in table})[:4]}"
        )
    updates: list[tuple[Tensor, Tensor]] = []
    used: set[str] = set()
    for target, sources in table:
        param = params[target]
        absent = [s for s in sources if s not in inner]
        if absent:
            report.missing += [prefix + s for s in absent]
            continue
        # Fused q;k;v rows: each source holds an equal share of the first axis.
        want = (param.shape[0] // len(sources), *param.shape[1:])
        for s in sources:
            if tuple(inner[s].shape) != want:
                raise CheckpointError(
                    f"weight {s} in {source} has shape {tuple(inner[s].shape)}, expected "
                    f"{want} from config.json"
                )
        value = inner[sources[0]] if len(sources) == 1 else torch.cat([inner[s] for s in sources])
        updates.append((param, value))
        used.update(sources)
        report.loaded.append(target)
    kept: dict[str, Tensor] = {}
    for key in sorted(set(inner) - used):
        if key in family.ignored_keys:
            report.ignored.append(prefix + key)
        elif key.startswith(family.unused_prefixes):
            report.unused.append(prefix + key)
            if key.startswith(family.kept_prefixes):
                kept[key] = inner[key]  # saved back under the base model's own name
        else:
            report.unexpected.append(prefix + key)
    for key in sorted(outer):
        bucket = report.unused if key.startswith(family.unused_prefixes) else report.unexpected
        bucket.append(key)
    if strict and not report.complete:
        problems = []
        if report.missing:
            problems.append(f"missing {report.missing[:5]}")
        if report.unexpected:
            problems.append(f"unexpected {report.unexpected[:5]}")
        raise CheckpointError(
            f"{source} does not match a {family.model_type} encoder of its config.json: "
            f"{'; '.join(problems)} (load with strict=False to accept it)"
        )
    with torch.no_grad():
        for param, value in updates:
            param.copy_(value.to(param.dtype))
    return report, kept


def export_state(model: EncoderModel, family: Family) -> dict[str, Tensor]:
    """``model``'s parameters under the Hugging Face base model's names (inverse of loading)."""
    params = dict(model.named_parameters())
    out: dict[str, Tensor] = {}
    for target, sources in family.name_table(model.config.n_layers):
        pieces = params[target].detach().chunk(len(sources), dim=0)  # q; k; v rows apart
        for name, piece in zip(sources, pieces, strict=True):
            out[name] = piece.contiguous().clone()
    return out
