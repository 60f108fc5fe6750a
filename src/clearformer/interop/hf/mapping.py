"""Hugging Face state dicts <-> :class:`clearformer.EncoderModel`, strictly and shape-checked.

Loading walks the family's name table (see :mod:`.families`): every clearformer
parameter must find its sources, every source must have the shape the config implies, and
every checkpoint key must be used, be a known task head or pooler (reported, not loaded), or be
a known buffer. Anything else is an error unless ``strict=False``, which reports it instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import Tensor

from ...model import EncoderModel
from .families import Family
from .files import CheckpointError
from .weights import CheckpointTensors

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


def _normalised_names(keys: Iterable[str]) -> dict[str, str]:
    """Each checkpoint key under the name the tables use (LayerNorm ``gamma`` / ``beta`` as
    ``weight`` / ``bias``) -> the key as stored. Names only: no tensor is read to rename it."""
    out = {}
    for stored in keys:
        key = stored
        for old, new in _LEGACY_SUFFIXES.items():
            if key.endswith(old) and "LayerNorm" in key:
                key = key[: -len(old)] + new
        out[key] = stored
    return out


def _split_prefix(
    names: dict[str, str], family: Family
) -> tuple[dict[str, str], dict[str, str], str]:
    """(encoder keys with a task model's prefix removed, keys outside the encoder, prefix),
    each name -> its key as stored."""
    prefix = family.base_prefix
    if not any(k.startswith(prefix) for k in names):
        return names, {}, ""
    inner = {k[len(prefix) :]: v for k, v in names.items() if k.startswith(prefix)}
    outer = {k: v for k, v in names.items() if not k.startswith(prefix)}
    return inner, outer, prefix


class _Piece(NamedTuple):
    """One source's share of a parameter: checkpoint tensor ``key`` (or rows ``rows`` of it,
    one part of a fused tensor) goes to rows ``[first, stop)`` of the parameter."""

    key: str
    rows: tuple[int, int] | None
    first: int
    stop: int


class StatePlan(NamedTuple):
    """Where every parameter of a model comes from in a checkpoint, checked, before any is
    written: :func:`plan_state`'s answer, for :func:`fill_state`."""

    report: LoadReport
    kept: dict[str, Tensor]  # base-model tensors clearformer does not run (the pooler)
    fills: list[tuple[str, list[_Piece]]]  # parameter name -> its pieces, in the table's order
    checkpoint: CheckpointTensors


def load_state(
    model: EncoderModel,
    tensors: Mapping[str, Tensor],
    family: Family,
    *,
    strict: bool = True,
    source: str = "checkpoint",
) -> tuple[LoadReport, dict[str, Tensor]]:
    """Copy a Hugging Face state dict into ``model``: :func:`plan_state`, then
    :func:`fill_state` of every parameter.

    ``tensors`` may be a :class:`~.weights.CheckpointTensors` that reads each tensor from its
    file on demand: the checks use the shapes alone, and each tensor is then read (for the
    parameters whose dtype it has, straight into the parameter) and dropped before the next,
    so a load holds the model and at most one tensor besides.

    Returns:
        The report, and the base-model tensors that clearformer does not run (the pooler), so a
        save can write them back.

    Raises:
        CheckpointError: a tensor of the wrong shape (always); with ``strict``, also missing or
            unexpected keys. Shapes are all checked before any parameter is written.
    """
    plan = plan_state(model, tensors, family, strict=strict, source=source)
    fill_state(model, plan)
    return plan.report, plan.kept


def plan_state(
    model: EncoderModel,
    tensors: Mapping[str, Tensor],
    family: Family,
    *,
    strict: bool = True,
    source: str = "checkpoint",
) -> StatePlan:
    """Every check of :func:`load_state`, and where each parameter's values are, without
    writing any: the model may still be on the meta device (shapes alone are read)."""
    checkpoint = tensors if isinstance(tensors, CheckpointTensors) else CheckpointTensors(tensors)
    report = LoadReport(source=source, architecture=family.model_type)
    inner, outer, prefix = _split_prefix(_normalised_names(checkpoint), family)
    params = dict(model.named_parameters())
    table = family.name_table(model.config.n_layers, model.config)
    if {t for t, _ in table} != set(params):
        raise CheckpointError(
            f"internal name table for {family.model_type} does not cover the model: "
            f"{sorted(set(params) ^ {t for t, _ in table})[:4]}"
        )
    plan: list[tuple[str, list[_Piece]]] = []
    used: set[str] = set()
    for target, sources in table:
        param = params[target]
        if not sources:  # the layout lacks this bias: zeros compute what the checkpoint does
            plan.append((target, []))
            report.loaded.append(target)
            continue
        names = [source_part(s)[0] for s in sources]
        absent = list(dict.fromkeys(n for n in names if n not in inner))
        if absent:
            report.missing += [prefix + n for n in absent]
            continue
        rows = row_split(model, target, len(sources))
        plan.append((target, _pieces(checkpoint, inner, sources, rows, param, source)))
        used.update(names)
        report.loaded.append(target)
    kept: dict[str, Tensor] = {}
    for key in sorted(set(inner) - used):
        if key in family.ignored_keys:
            report.ignored.append(prefix + key)
        elif key.startswith(family.unused_prefixes):
            report.unused.append(prefix + key)
            if key.startswith(family.kept_prefixes):
                kept[key] = checkpoint[inner[key]]  # saved back under the base model's own name
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
    return StatePlan(report, kept, plan, checkpoint)


def fill_state(model: EncoderModel, plan: StatePlan, names: Iterable[str] | None = None) -> None:
    """Write the parameters ``names`` (None: every one the plan has) of ``model`` from the
    checkpoint, each looked up now (a parameter made real after the plan was made is the one
    written)."""
    chosen = None if names is None else set(names)
    with torch.no_grad():
        for target, pieces in plan.fills:
            if chosen is None or target in chosen:
                _fill(model.get_parameter(target), pieces, plan.checkpoint)


def _pieces(
    checkpoint: CheckpointTensors,
    keys: dict[str, str],
    sources: list[str],
    rows_each: list[int],
    param: Tensor,
    source: str,
) -> list[_Piece]:
    """Where each source's rows go in ``param`` (fused rows: q; k; v, or gate; up, each source
    holding its share of the first axis), after checking every source's shape as stored."""
    pieces: list[_Piece] = []
    first = 0
    for s, rows in zip(sources, rows_each, strict=True):
        name, index, count = source_part(s)
        shape = checkpoint.shape(keys[name])
        if count > 1 and shape and shape[0] % count:
            raise CheckpointError(
                f"weight {name} in {source} has {shape[0]} rows, which do not split "
                f"into its {count} fused parts"
            )
        part = (shape[0] // count, *shape[1:]) if count > 1 and shape else shape
        if part != (rows, *param.shape[1:]):
            raise CheckpointError(
                f"weight {name} in {source} has shape {shape}, expected "
                f"{(rows * count, *param.shape[1:])} from config.json"
            )
        span = None if count == 1 else (index * rows, (index + 1) * rows)
        pieces.append(_Piece(keys[name], span, first, first + rows))
        first += rows
    return pieces


def _fill(param: Tensor, pieces: list[_Piece], checkpoint: CheckpointTensors) -> None:
    """Write ``param`` from its pieces, each straight into its block of rows (no
    concatenation: a fused parameter is never assembled in a second tensor first)."""
    if not pieces:
        param.zero_()
        return
    for piece in pieces:
        into = param if len(pieces) == 1 else param[piece.first : piece.stop]
        checkpoint.copy_into(piece.key, into, piece.rows)


def row_split(model: EncoderModel, target: str, count: int) -> list[int]:
    """The rows each of ``count`` sources gives parameter ``target``: an attention's fused
    ``in_proj`` says its own (``proj_sizes``: fewer key and value rows under grouped-query
    attention); anything else splits evenly (a gated feed-forward's gate; up)."""
    param = model.get_parameter(target)
    if count == 1:
        return [param.shape[0]]
    linear, _ = target.rsplit(".", 1)
    owner, name = linear.rsplit(".", 1) if "." in linear else ("", linear)
    sizes = getattr(model.get_submodule(owner), "proj_sizes", None) if name == "in_proj" else None
    if sizes is not None and len(sizes) == count:
        return list(sizes)
    return [param.shape[0] // count] * count


def export_state(model: EncoderModel, family: Family) -> dict[str, Tensor]:
    """``model``'s parameters under the Hugging Face base model's names (inverse of loading).

    Raises:
        CheckpointError: a parameter the family's layout lacks (ZEROS) is not all zeros.
    """
    params = dict(model.named_parameters())
    out: dict[str, Tensor] = {}
    fused: dict[str, list[Tensor | None]] = {}  # a tensor saved in parts: its parts in order
    for target, sources in family.name_table(model.config.n_layers, model.config):
        if not sources:
            if params[target].detach().count_nonzero():
                raise CheckpointError(
                    f"{target} is not all zeros, but a {family.model_type} checkpoint has no "
                    "such tensor (its layout has no bias there), so it cannot be saved"
                )
            continue
        rows = row_split(model, target, len(sources))
        pieces = params[target].detach().split(rows, dim=0)  # q; k; v rows apart
        for s, piece in zip(sources, pieces, strict=True):
            name, index, count = source_part(s)
            if count == 1:
                out[name] = piece.contiguous().clone()
            else:
                fused.setdefault(name, [None] * count)[index] = piece
    for name, parts in fused.items():
        out[name] = torch.cat(parts).contiguous()  # every part is in a complete table
    return out


def source_part(source: str) -> tuple[str, int, int]:
    """(checkpoint key, part, parts) of a name-table source: ``"mlp.up_gate_proj.weight#1/2"``
    is the second of two equal row blocks of that tensor (a checkpoint that fuses what
    clearformer stacks in another order); a plain key is the whole tensor, part 0 of 1."""
    name, _, part = source.partition("#")
    if not part:
        return name, 0, 1
    index, _, count = part.partition("/")
    return name, int(index), int(count)
