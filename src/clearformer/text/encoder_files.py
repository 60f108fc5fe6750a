"""What ``TextEncoder.from_pretrained`` reads from a checkpoint directory, in the order that
finds a mistake before the weights are read (the family's config, the tokenizer, the
sentence-transformers modules after the pooling (:mod:`clearformer.interop.hf.st_modules`),
a default Matryoshka cut, then the weights), and what ``save_pretrained`` writes back."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from ..devices import check_device, model_device
from ..heads.sentence import SentenceHead
from ..interop.hf import (
    LoadedModel,
    PoolingConfig,
    TextTokenizer,
    find_checkpoint,
    load_model,
    pooling_from_config,
    save_model,
)
from ..interop.hf.files import CHECKPOINT_FILES
from ..interop.hf.loading import read_family
from ..interop.hf.sentence_transformers import Prompts, prompts_from_files
from ..interop.hf.st_modules import build_head, read_head, truncate_dim_from_files, write_head
from ..interop.hf.tokenizer import max_length_for
from ..io import atomic_write
from ..options import Decision
from ..precision.names import is_int8

log = logging.getLogger(__name__)


@dataclass
class EncoderParts:
    """A checkpoint directory's parts, as :class:`~.encoder.TextEncoder` takes them."""

    loaded: LoadedModel
    tokenizer: TextTokenizer
    pooling: PoolingConfig
    head: SentenceHead
    truncate_dim: int | None
    prompts: Prompts


def read_encoder_parts(
    path: str | os.PathLike | None,
    *,
    backend: str,
    strict: bool,
    padding_side: str | None,
    truncate_dim: int | None,
    precision: str = "float32",
    defer_layers: bool = False,
) -> EncoderParts:
    """The parts of the checkpoint at ``path`` (None: the bundled model); see
    ``TextEncoder.from_pretrained`` for the arguments and the errors."""
    started = time.perf_counter()
    refuse_other_kinds(path, "TextEncoder")
    files = find_checkpoint(path)
    pooling = pooling_from_config(files.pooling_config, files.pooling_path)
    _, config = read_family(files, backend)  # the width the head needs, before any weight
    # The tokenizer (and the caller's padding_side) from config.json alone: a refusal comes
    # before the weights are read, which can take minutes.
    pad_id = config.pad_token_id if config.pad_token_id is not None else 0
    tokenizer = TextTokenizer.from_files(
        files,
        max_length_for(files, config.max_length),
        pad_id,
        vocab_size=config.vocab_size,
        padding_side=padding_side,
    )
    head_config, dense = read_head(files, config.d_model)
    head = build_head(head_config, dense)
    if truncate_dim is None:
        truncate_dim = truncate_dim_from_files(files)
    head.check_dimensions(truncate_dim, "truncate_dim")
    loaded = load_model(
        files, backend=backend, strict=strict, precision=precision, defer_layers=defer_layers
    )
    log.info("loaded %s in %.2fs", files.path, time.perf_counter() - started)
    architectures = files.config.get("architectures") or []
    if any(str(a).endswith("ForSequenceClassification") for a in architectures):
        log.warning(
            "%s is a %s checkpoint: its encoder was trained to score pairs (CrossEncoder), "
            "not to embed texts, so its embeddings may mean little",
            files.path,
            architectures[0],
        )
    return EncoderParts(loaded, tokenizer, pooling, head, truncate_dim, prompts_from_files(files))


def place_parts(parts: EncoderParts, device, held: Decision | None = None) -> None:
    """Move ``parts``' model and head to ``device`` (checked first): refused for a model
    ``held`` in int8 (CPUs only) and for one whose layers are not read yet."""
    device = check_device(device)
    if device.type != "cpu" and held is not None and is_int8(held.choice):
        raise ValueError(
            f"device={str(device)!r}: precision={held.choice!r} runs on CPUs only; "
            f"hold 'bf16' or 'float32' there"
        )
    if device != model_device(parts.loaded.model):
        if parts.loaded.deferred is not None:
            raise ValueError(
                f"device={str(device)!r}: the model's layers are not read yet (parts "
                f"read with defer_layers=True are for an int8 load on the CPU)"
            )
        parts.loaded.model.to(device)
    parts.head.to(device)


def refuse_other_kinds(path: str | os.PathLike | None, loader: str) -> None:
    """A one-line CheckpointError when the directory at ``path`` holds a sparse, multi-vector
    or BGE-M3 model, naming the class that loads it: pooled into one vector, its token states
    would give embeddings that mean nothing (and a Router's directory has no checkpoint at its
    root, which would be reported as incomplete)."""
    from ..interop.hf import CheckpointError
    from ..model_kinds import kind_error, model_kind

    if not isinstance(path, str | os.PathLike) or not Path(path).expanduser().is_dir():
        return  # the bundled model (None), or an error find_checkpoint reports
    kind = model_kind(path)
    if kind != "dense":
        raise CheckpointError(kind_error(Path(path).expanduser().resolve(), kind, loader))


def write_encoder_files(encoder, directory: str | os.PathLike) -> Path:
    """Write ``encoder`` (a :class:`~.encoder.TextEncoder`) as a checkpoint directory: the
    model in Hugging Face format, the tokenizer and sentence-transformers files it was loaded
    with, and the Pooling, Dense and Normalize folders (Dense weights as the head now holds
    them)."""
    loaded = encoder._loaded
    out = save_model(
        encoder.model,
        directory,
        loaded.architecture,
        base_config=loaded.hf_config,
        kept=loaded.kept,
    )
    for name in CHECKPOINT_FILES:
        if (encoder.path / name).is_file():
            with atomic_write(out / name, "wb") as handle:
                handle.write((encoder.path / name).read_bytes())
    write_head(encoder.head, loaded.files.modules or [], encoder.path, out)
    return out
