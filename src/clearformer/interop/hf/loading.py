"""Load a checkpoint directory into an :class:`~clearformer.EncoderModel`, and save one back."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ...checks import check_choice
from ...config import EncoderConfig
from ...io import atomic_write
from ...model import EncoderModel
from ...options import BACKENDS
from .families import Family, family_for, family_named
from .files import CheckpointError, CheckpointFiles, find_checkpoint
from .mapping import LoadReport, export_state, load_state, plan_state
from .weights import open_tensors, write_safetensors

if TYPE_CHECKING:
    from .deferred import DeferredLayers

log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    """A model loaded from a checkpoint, with everything needed to save it back."""

    model: EncoderModel  # eval mode
    report: LoadReport
    architecture: Family  # the checkpoint's family (the field keeps its earlier name)
    hf_config: dict[str, Any]  # the checkpoint's config.json
    kept: dict[str, Tensor]  # base-model tensors clearformer does not run (the pooler)
    files: CheckpointFiles
    # With load_model(defer_layers=True): the encoder layers still to be read (None: all read).
    deferred: DeferredLayers | None = None


def load_model(
    path: str | os.PathLike | None | CheckpointFiles = None,
    *,
    backend: str = "auto",
    strict: bool = True,
    precision: str = "float32",
    defer_layers: bool = False,
) -> LoadedModel:
    """Build an :class:`EncoderModel` from a Hugging Face checkpoint directory.

    Args:
        path: a checkpoint directory; None = the bundled all-MiniLM-L6-v2.
        backend: attention backend for the model (``auto`` packs ragged batches).
        strict: refuse checkpoints with missing or unexpected keys.
        precision: ``"float32"``, or ``"bf16"``: the model
            :func:`~clearformer.precision.bf16_copy` would make of the float32 one, built
            empty in bfloat16 and filled from the checkpoint, so that the float32 model is
            never in memory (every weight must then be in the checkpoint).
        defer_layers: float32 only: leave the encoder layers on the meta device, to be read
            one at a time through the returned :attr:`LoadedModel.deferred`
            (:mod:`.deferred`), so that a conversion of each layer as it is read (int8) never
            holds the float32 model whole. A checkpoint that lacks some weights (which a
            float32 model would keep at their initial values) is read whole instead, and
            ``deferred`` is None.

    Raises:
        FileNotFoundError: no such directory.
        CheckpointError: incomplete, unsupported, corrupt or mismatched checkpoint.
    """
    # The arguments before the files: a bad backend would otherwise read as a fault of the
    # checkpoint's config.json.
    check_choice(backend, BACKENDS, "backend")
    if not isinstance(strict, bool):
        raise TypeError(f"strict must be True or False, got {strict!r}")
    files = path if isinstance(path, CheckpointFiles) else find_checkpoint(path)
    family, config = read_family(files, backend)  # validated before any weight
    # Safetensors are read a tensor at a time as the model is filled (headers are checked
    # here): the model and the whole checkpoint are never in memory together.
    if defer_layers and precision != "float32":  # before any weight is read
        raise ValueError(f"defer_layers reads float32 layers, got precision={precision!r}")
    tensors = open_tensors(files.weights)
    if defer_layers:
        return build_deferred(files, family, config, tensors, strict=strict)
    return build_model(files, family, config, tensors, strict=strict, precision=precision)


def read_family(files: CheckpointFiles, backend: str) -> tuple[Family, EncoderConfig]:
    """The checkpoint's family and :class:`EncoderConfig`, from config.json alone."""
    check_choice(backend, BACKENDS, "backend")  # the caller's, not a fault of config.json
    source = str(files.path / "config.json")
    family = family_for(files.config, source)
    return family, config_of(family, files.config, source, backend)


def build_model(
    files: CheckpointFiles,
    family: Family,
    config: EncoderConfig,
    tensors: Mapping[str, Tensor],
    *,
    strict: bool,
    precision: str = "float32",
) -> LoadedModel:
    """An :class:`EncoderModel` of ``config`` filled from ``tensors`` (the checkpoint's: a dict,
    or a :class:`~.weights.CheckpointTensors` that reads each one when it is copied), in
    ``precision`` (see :func:`load_model`)."""
    if precision not in ("float32", "bf16"):
        raise ValueError(f"precision must be 'float32' or 'bf16', got {precision!r}")
    if precision == "bf16":
        from ...precision import empty_bf16

        with torch.device("meta"):  # shapes only: no float32 weight is ever made
            model = EncoderModel(config)
        model = empty_bf16(model)  # outside the meta context: computed buffers are real
    else:
        model = EncoderModel(config)
    report, kept = load_state(model, tensors, family, strict=strict, source=str(files.weights))
    if precision == "bf16" and report.missing:
        # An empty parameter has no initial values to fall back on, as a float32 model has.
        raise CheckpointError(
            f"{files.weights} lacks {report.missing[:5]}: a model loaded in bf16 is filled "
            f"from the checkpoint alone (load it in float32 to start those from random values)"
        )
    log.info("%s", report)
    return LoadedModel(model.eval(), report, family, dict(files.config), kept, files)


def build_deferred(
    files: CheckpointFiles,
    family: Family,
    config: EncoderConfig,
    tensors: Mapping[str, Tensor],
    *,
    strict: bool,
) -> LoadedModel:
    """:func:`build_model` in float32 with the encoder layers left unread (see
    :func:`load_model`'s ``defer_layers``)."""
    from .deferred import DeferredLayers, fill_outside_layers  # reads the precision package

    with torch.device("meta"):  # shapes only: each part is made real as it is read
        model = EncoderModel(config)
    plan = plan_state(model, tensors, family, strict=strict, source=str(files.weights))
    if plan.report.missing:  # initial values are wanted: the whole float32 model, as built
        return build_model(files, family, config, tensors, strict=strict)
    fill_outside_layers(model, plan)
    log.info("%s", plan.report)
    deferred = DeferredLayers(model, plan)
    return LoadedModel(
        model.eval(), plan.report, family, dict(files.config), plan.kept, files, deferred
    )


def config_of(family: Family, hf: dict[str, Any], source: str, backend: str):
    """The family's :class:`EncoderConfig` for ``hf``; an error names the file it came from
    (a family's message names the field)."""
    try:
        return family.encoder_config(hf, backend=backend)
    except CheckpointError as exc:
        raise CheckpointError(f"{source}: {exc}") from None
    except (TypeError, ValueError) as exc:  # EncoderConfig's own checks, in a family's terms
        raise CheckpointError(f"{source}: {exc}") from None


def save_model(
    model: EncoderModel,
    directory: str | os.PathLike,
    architecture: Family | str,
    *,
    base_config: dict[str, Any] | None = None,
    kept: dict[str, Tensor] | None = None,
) -> Path:
    """Write ``model`` as a Hugging Face checkpoint (``config.json`` + ``model.safetensors``)
    that ``transformers.AutoModel.from_pretrained`` loads with the same outputs.

    Args:
        architecture: the family, or its ``model_type`` (``"bert"``, ``"roberta"``, ...).
        base_config: a config.json whose other fields are kept (the loaded checkpoint's).
        kept: tensors written as they are (the pooler a load set aside).

    Each file is written atomically; the directory is created if needed.

    Raises:
        CheckpointError: an unknown ``architecture``, or a model its family cannot express
            (before any file is written).
    """
    family = (
        family_named(architecture, "save_model(architecture=...)")
        if isinstance(architecture, str)
        else architecture
    )
    # Both built before anything is written: a config the family cannot express (a gated
    # activation, say) must not leave a weights file without its config.json.
    config = family.hf_config(model.config, base_config)
    tensors = export_state(model, family)
    for name, value in (kept or {}).items():
        tensors.setdefault(name, value.detach().contiguous().clone())
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    write_safetensors(tensors, out / "model.safetensors")
    with atomic_write(out / "config.json") as handle:
        json.dump(config, handle, indent=2, sort_keys=True)
        handle.write("\n")
    return out


def save_with_head(
    model: EncoderModel,
    head: Any,
    layout: Any,
    family: Family,
    config: dict[str, Any],
    directory: str | os.PathLike,
) -> Path:
    """Write ``model`` and a task ``head`` as one task checkpoint (``*ForMaskedLM``,
    ``*ForSequenceClassification``): the encoder's tensors under the family's base prefix, the
    head's under the names ``layout`` gives, and ``config`` as config.json."""
    tensors = {family.base_prefix + k: v for k, v in export_state(model, family).items()}
    params = dict(head.named_parameters())
    for target, (key,) in layout.names:
        tensors[key] = params[target].detach().contiguous().clone()
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    write_safetensors(tensors, out / "model.safetensors")
    with atomic_write(out / "config.json") as handle:
        json.dump(config, handle, indent=2, sort_keys=True)
        handle.write("\n")
    return out
