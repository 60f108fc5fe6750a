"""Load a checkpoint directory into an :class:`~clearformer.EncoderModel`, and save one back."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor

from ..io import atomic_write
from ..model import EncoderModel
from .architectures import Architecture, architecture_for
from .checkpoint import CheckpointFiles, find_checkpoint
from .hf_mapping import LoadReport, export_state, load_state
from .weights import read_tensors, write_safetensors

log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    """A model loaded from a checkpoint, with everything needed to save it back."""

    model: EncoderModel  # eval mode
    report: LoadReport
    architecture: Architecture
    hf_config: dict[str, Any]  # the checkpoint's config.json
    kept: dict[str, Tensor]  # base-model tensors clearformer does not run (the pooler)
    files: CheckpointFiles


def load_model(
    path: str | os.PathLike | None | CheckpointFiles = None,
    *,
    backend: str = "auto",
    strict: bool = True,
) -> LoadedModel:
    """Build an :class:`EncoderModel` from a Hugging Face checkpoint directory.

    Args:
        path: a checkpoint directory; None = the bundled all-MiniLM-L6-v2.
        backend: attention backend for the model (``auto`` packs ragged batches).
        strict: refuse checkpoints with missing or unexpected keys.

    Raises:
        FileNotFoundError: no such directory.
        CheckpointError: incomplete, unsupported, corrupt or mismatched checkpoint.
    """
    files = path if isinstance(path, CheckpointFiles) else find_checkpoint(path)
    source = str(files.path / "config.json")
    arch = architecture_for(files.config, source)
    config = arch.encoder_config(files.config, backend=backend)  # validated before any weight
    model = EncoderModel(config)
    tensors = read_tensors(files.weights)
    report, kept = load_state(model, tensors, arch, strict=strict, source=str(files.weights))
    log.info("%s", report)
    return LoadedModel(model.eval(), report, arch, dict(files.config), kept, files)


def save_model(
    model: EncoderModel,
    directory: str | os.PathLike,
    architecture: Architecture | str,
    *,
    base_config: dict[str, Any] | None = None,
    kept: dict[str, Tensor] | None = None,
) -> Path:
    """Write ``model`` as a Hugging Face checkpoint (``config.json`` + ``model.safetensors``)
    that ``transformers.AutoModel.from_pretrained`` loads with the same outputs.

    Each file is written atomically; the directory is created if needed.
    """
    from .architectures import ARCHITECTURES

    arch = ARCHITECTURES[architecture] if isinstance(architecture, str) else architecture
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tensors = export_state(model, arch)
    for name, value in (kept or {}).items():
        tensors.setdefault(name, value.detach().contiguous().clone())
    write_safetensors(tensors, out / "model.safetensors")
    config = arch.hf_config(model.config, base_config)
    with atomic_write(out / "config.json") as handle:
        json.dump(config, handle, indent=2, sort_keys=True)
        handle.write("\n")
    return out
