"""A checkpoint's masked-language-model head (``*ForMaskedLM``) as a
:class:`~clearformer.heads.MaskedLMHead` on top of its encoder, and back.

The family says where the head's tensors are (:attr:`Family.masked_lm`). The encoder loads as
usual; the head then takes its tensors, and the report lists them as loaded. The decoder is
tied to the encoder's word embeddings, so :meth:`LoadedMaskedLM.logits` passes that table.

A save (:func:`save_masked_lm`, :meth:`LoadedMaskedLM.save_pretrained`) writes transformers'
``*ForMaskedLM`` layout: the encoder under the family's task-model prefix (``bert.``), the
head under its own names, the tied decoder left out as transformers leaves it out, and a
config.json naming the ``*ForMaskedLM`` class, so ``AutoModelForMaskedLM.from_pretrained``
loads it with no missing key and the same logits.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ...heads import MaskedLMConfig, MaskedLMHead
from ...io import atomic_write
from ...model import EncoderModel
from .families import Family, HeadLayout, family_named
from .files import CheckpointError, CheckpointFiles, find_checkpoint
from .heads import load_head
from .loading import LoadedModel, build_model, read_family, save_with_head
from .mapping import LoadReport
from .weights import CheckpointTensors, open_tensors

log = logging.getLogger(__name__)

# Tokenizer files a save copies from the loaded checkpoint, so the saved directory is complete.
_TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "tokenizer_config.json",
    "special_tokens_map.json",
)
# Activation names that are one function (the tanh form of GELU) under several spellings: a
# save compares the head's activation with the one config.json will make transformers use.
_SAME_FUNCTION = {
    "gelu_new": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
}


@dataclass
class LoadedMaskedLM:
    """An encoder and its masked-LM head, loaded from one checkpoint."""

    loaded: LoadedModel
    head: MaskedLMHead  # eval mode
    # (V, D): a decoder with weights of its own (config.json tie_word_embeddings false), loaded
    # only when asked (load_masked_lm(untied=True)); None: the word embeddings decode.
    decoder: Tensor | None = None

    @property
    def decoder_weight(self) -> Tensor:
        """The (V, D) table the head decodes with: :attr:`decoder`, else the word embeddings."""
        return self.loaded.model.embeddings.word.weight if self.decoder is None else self.decoder

    def logits(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        *,
        backend: str | None = None,
    ) -> Tensor:
        """(B, T) ids (mask and token types as :class:`~clearformer.EncoderModel` takes them)
        -> (B, T, V) vocabulary logits (at padded positions: the logits of a zero state)."""
        model = self.loaded.model
        hidden = model(input_ids, attention_mask, token_type_ids, backend=backend)  # (B, T, D)
        return self.head(hidden, self.decoder_weight)  # (B, T, V)

    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        """Write encoder and head as the checkpoint's ``*ForMaskedLM``
        (:func:`save_masked_lm`), with the loaded checkpoint's other config.json fields and its
        tokenizer files.

        Raises:
            CheckpointError: the head has a decoder of its own, which this save does not write.
        """
        if self.decoder is not None:
            raise CheckpointError(
                f"{self.loaded.files.path} has a decoder of its own (tie_word_embeddings false); "
                "clearformer saves masked-LM heads tied to the word embeddings only"
            )
        out = save_masked_lm(
            self.loaded.model,
            self.head,
            directory,
            self.loaded.architecture,
            base_config=self.loaded.hf_config,
        )
        copy_tokenizer_files(self.loaded.files.path, out)
        return out


def copy_tokenizer_files(source: str | os.PathLike, out: str | os.PathLike) -> None:
    """Copy a checkpoint directory's tokenizer files into ``out`` (each written atomically),
    so that a saved directory is complete."""
    source, out = Path(source), Path(out)
    for name in _TOKENIZER_FILES:
        if (source / name).is_file() and (source / name).resolve() != (out / name).resolve():
            with atomic_write(out / name, "wb") as handle:
                handle.write((source / name).read_bytes())


def load_masked_lm(
    path: str | os.PathLike | None | CheckpointFiles,
    *,
    backend: str = "auto",
    strict: bool = True,
    new_head: bool = False,
    untied: bool = False,
) -> LoadedMaskedLM:
    """Load a ``*ForMaskedLM`` checkpoint: encoder and head.

    Args:
        new_head: a checkpoint without a masked-LM head (a base model, a sentence-embedding
            model) gets a freshly initialised one (:func:`initialise_head`) instead of the
            error: the start of masked-LM training.
        untied: accept a decoder with weights of its own (config.json
            ``tie_word_embeddings`` false), kept in :attr:`LoadedMaskedLM.decoder`, for
            inference (a SPLADE model); without it such a checkpoint is refused.

    Raises:
        FileNotFoundError: no such directory.
        CheckpointError: the family has no masked-LM head in clearformer, the checkpoint has
            none (unless ``new_head``), its decoder is not tied to the word embeddings, or its
            tensors do not match config.json.
    """
    files = path if isinstance(path, CheckpointFiles) else find_checkpoint(path)
    family, config = read_family(files, backend)
    source = files.path / "config.json"
    layout = _layout(family, files.config, source)
    own_decoder = files.config.get("tie_word_embeddings", True) is not True
    if own_decoder and not untied:
        raise CheckpointError(
            f"{source}: 'tie_word_embeddings' must be true for a masked-LM head in clearformer "
            f"(it decodes with the word embeddings), got "
            f"{files.config.get('tie_word_embeddings')!r}: the decoder has weights of its own"
        )
    tensors = _normalise_head_keys(open_tensors(files.weights))  # read when copied
    keys = [key for _, sources in layout.names for key in sources]
    if new_head and not any(key in tensors for key in keys):
        loaded = build_model(files, family, config, tensors, strict=strict)
        log.info("%s has no masked-LM head: a new one, initialised", files.path)
        head = initialise_head(MaskedLMHead(layout.config), files.config)
        return LoadedMaskedLM(loaded, head.eval())
    if not any(key in tensors for key in keys):
        raise CheckpointError(
            f"{files.path} has no masked-LM head: {files.weights.name} lacks {keys[0]!r} "
            f"(config.json 'architectures'={files.config.get('architectures')!r})"
        )
    loaded = build_model(files, family, config, tensors, strict=strict)
    head = MaskedLMHead(layout.config)
    weights = str(files.weights)
    load_head(
        head, layout, tensors, loaded.report, strict=strict, source=weights, kind="masked-LM head"
    )
    decoder = None
    if own_decoder:
        decoder, used = _own_decoder(layout, tensors, loaded, head, weights)
        tensors = tensors.without(used)  # the decoder's own tensors are not tied copies
    _check_tied_copies(layout, tensors, loaded, head, weights)
    return LoadedMaskedLM(loaded, head.eval(), decoder)


def save_masked_lm(
    model: EncoderModel,
    head: MaskedLMHead,
    directory: str | os.PathLike,
    architecture: Family | str,
    *,
    base_config: dict[str, Any] | None = None,
) -> Path:
    """Write ``model`` and ``head`` as a transformers ``*ForMaskedLM`` checkpoint
    (``config.json`` + ``model.safetensors``, each written atomically).

    Args:
        architecture: the family, or its ``model_type`` (``"bert"``, ``"roberta"``, ...).
        base_config: a config.json whose other fields are kept (the loaded checkpoint's).

    Raises:
        CheckpointError: the family has no masked-LM head in clearformer, or ``head`` is not
            the head the written config.json makes transformers build (another activation or
            epsilon, say); nothing is written then.
    """
    family = (
        family_named(architecture, "save_masked_lm(architecture=...)")
        if isinstance(architecture, str)
        else architecture
    )
    config = family.hf_config(model.config, base_config)
    # BertModel -> BertForMaskedLM, and so on for every family.
    config["architectures"] = [family.hf_class.removesuffix("Model") + "ForMaskedLM"]
    config["tie_word_embeddings"] = True
    layout = _layout(family, config, Path(directory) / "config.json")
    _check_head_matches(head.config, layout.config, family)
    out = save_with_head(model, head, layout, family, config, directory)
    log.info("saved %s (%s) to %s", config["architectures"][0], family.model_type, out)
    return out


def head_config(family: Family, hf: dict[str, Any]) -> MaskedLMConfig:
    """The masked-LM head transformers builds for this config.json (activation, epsilon,
    biases), whether or not the checkpoint holds one.

    Raises:
        CheckpointError: the family has no masked-LM head in clearformer, or config.json asks
            for one it cannot run.
    """
    return _layout(family, hf, Path("config.json")).config


def initialise_head(head: MaskedLMHead, hf: dict[str, Any]) -> MaskedLMHead:
    """BERT's initialisation of a new head, in place, as transformers initialises a head that
    a checkpoint lacks: the dense layer normal with config.json's ``initializer_range``
    (0.02), zero biases, the norm a unit gain."""
    std = float(hf.get("initializer_range", 0.02))
    with torch.no_grad():
        torch.nn.init.normal_(head.dense.weight, std=std)
        for bias in (head.dense.bias, head.norm.bias, head.bias):
            if bias is not None:
                bias.zero_()
        head.norm.weight.fill_(1.0)
    return head


def _layout(family: Family, hf: dict[str, Any], source: Path) -> HeadLayout:
    if family.masked_lm is None:
        raise CheckpointError(
            f"{source}: model_type={family.model_type!r} has no masked-LM head in clearformer"
        )
    try:
        return family.masked_lm(hf)
    except (CheckpointError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{source}: {exc}") from None


def _normalise_head_keys(tensors: Mapping[str, Tensor]) -> CheckpointTensors:
    """Checkpoints converted from TensorFlow (bert-base-uncased among them) name the head's
    LayerNorm parameters gamma / beta, as the encoder's (which :mod:`.mapping` renames). The
    names change; no tensor is read."""
    renames = {".gamma": ".weight", ".beta": ".bias"}

    def renamed(key: str) -> str:
        for old, new in renames.items():
            if "LayerNorm" in key and key.endswith(old):
                return key[: -len(old)] + new
        return key

    if not isinstance(tensors, CheckpointTensors):
        tensors = CheckpointTensors(tensors)  # a dict of tensors in memory
    return tensors.renamed(renamed)


def _own_decoder(
    layout: HeadLayout,
    tensors: Mapping[str, Tensor],
    loaded: LoadedModel,
    head: MaskedLMHead,
    source: str,
) -> tuple[Tensor, tuple[str, ...]]:
    """An untied checkpoint's decoder table, (V, D), checked and listed as loaded, and the
    names of the tensors it took (the table, and the bias where the file has one). Untied,
    transformers 5 decodes with the decoder's own bias too (``cls.predictions.decoder.bias``,
    where 4.x kept it equal to ``cls.predictions.bias``): the head takes it where the file
    has it."""
    tied = dict((part, k) for k, part in getattr(layout, "tied", ()))
    bias_key = tied.get("bias")
    if bias_key in tensors and head.bias is not None:
        if tensors[bias_key].shape != head.bias.shape:
            raise CheckpointError(
                f"{source}: {bias_key!r} must have shape {tuple(head.bias.shape)}, got "
                f"{tuple(tensors[bias_key].shape)}"
            )
        with torch.no_grad():
            head.bias.copy_(tensors[bias_key])
    key = next((k for k, part in getattr(layout, "tied", ()) if part == "embedding"), None)
    want = tuple(loaded.model.embeddings.word.weight.shape)
    if key is None or key not in tensors or tuple(tensors[key].shape) != want:
        got = None if key is None or key not in tensors else tuple(tensors[key].shape)
        raise CheckpointError(
            f"{source}: config.json says the decoder is not tied to the word embeddings, so "
            f"{key!r} must hold it with shape {want}, got {got}"
        )
    report: LoadReport = loaded.report
    report.unused = [name for name in report.unused if name not in (key, bias_key)]
    report.loaded.append(key)
    used = (key,) if bias_key is None or head.bias is None else (key, bias_key)
    return tensors[key].to(loaded.model.embeddings.word.weight.dtype), used


def _check_tied_copies(
    layout: HeadLayout,
    tensors: Mapping[str, Tensor],
    loaded: LoadedModel,
    head: MaskedLMHead,
    source: str,
) -> None:
    """Older files store the tied decoder (and BERT's decoder bias) a second time. Each copy
    must equal what clearformer decodes with; a copy that differs means the checkpoint's
    decoder is really its own, and decoding with the embeddings would give other logits."""
    report: LoadReport = loaded.report
    for key, part in getattr(layout, "tied", ()):
        if key not in tensors:
            continue
        want = loaded.model.embeddings.word.weight if part == "embedding" else head.bias
        label = "the word embeddings" if part == "embedding" else "the head's bias"
        copy = tensors[key]
        if want is None or copy.shape != want.shape or not torch.equal(copy.to(want.dtype), want):
            raise CheckpointError(
                f"{key} in {source} differs from {label}: transformers ties the two, and "
                "clearformer decodes with the tied tensor; a checkpoint whose copy differs has "
                "a decoder of its own, which clearformer's MaskedLMHead does not run"
            )
        report.unused = [name for name in report.unused if name != key]
        report.ignored.append(key)  # a copy, not a weight of its own


def _check_head_matches(ours: MaskedLMConfig, theirs: MaskedLMConfig, family: Family) -> None:
    """``ours`` (the head being saved) must be the head transformers builds from the config.json
    being written (``theirs``), or the saved checkpoint would give other logits."""
    for f in fields(MaskedLMConfig):
        mine, wanted = getattr(ours, f.name), getattr(theirs, f.name)
        if f.name == "activation":
            mine, wanted = _SAME_FUNCTION.get(mine, mine), _SAME_FUNCTION.get(wanted, wanted)
        if mine != wanted:
            raise CheckpointError(
                f"the masked-LM head has {f.name}={getattr(ours, f.name)!r}, but a "
                f"{family.model_type} config.json of this encoder makes transformers build "
                f"{f.name}={getattr(theirs, f.name)!r}; nothing was written"
            )
