"""``mlm``: masked-language-model training on plain text.

Texts come from a ``.txt`` file (each non-blank line, or each paragraph: ``text_unit``), or
the ``text_field`` of a JSONL or CSV file, read by :mod:`.text_data` with its errors; exact
duplicates are dropped before the held-out split (``eval_fraction``, or ``eval_file``).
Fine-tunes a checkpoint (the bundled all-MiniLM-L6-v2 by default): a ``*ForMaskedLM``
checkpoint keeps its head, any other gets a new one, initialised as transformers would; or
the same shape from random weights (``from_scratch``), always with the checkpoint's tokenizer.

Masking is :mod:`..masking` (BERT's rule, drawn per (seed, step, example)); the held-out
texts are masked once. Metrics: the masked tokens' accuracy and perplexity, exp(mean
cross-entropy over the masked tokens), the default metric (lower is better); the training
loss is the same mean per masked token.

At the end of a run the model is also written as a transformers ``*ForMaskedLM`` directory,
``RUN/hf/``; :func:`export_hf` writes one from a run's final weights or from a checkpoint.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ...model import EncoderModel
from ..config import TrainConfig
from ..masking import (
    EVAL_STREAM,
    TRAIN_STREAM,
    MaskedBatch,
    MaskingVocab,
    collate_masked,
    generator,
    mask_example,
    masked_count,
)
from ..models import MaskedLanguageModel
from .base import stratified_split
from .text_data import LabelledText, deduplicate, read_texts

log = logging.getLogger(__name__)


class MlmTask:
    name = "mlm"
    metric = "perplexity"
    metrics = ("accuracy", "perplexity")
    labels: tuple[str, ...] = ()  # the vocabulary is the model's, not a set of classes

    def __init__(self, config: TrainConfig) -> None:
        from ...interop.hf import find_checkpoint
        from ...interop.hf.loading import read_family
        from ...interop.hf.masked_lm import head_config
        from ...interop.hf.tokenizer import TextTokenizer, max_length_for

        self.config = c = config
        self.files = find_checkpoint(None if c.model == "bundled" else c.model)
        self.family, cfg = read_family(self.files, "auto")
        head_config(self.family, self.files.config)  # a family without a head fails before data
        rows = read_texts(c.train_file, c.text_field, c.text_unit)
        rows, dropped, _ = deduplicate(rows, c.train_file)
        if dropped:
            log.warning("%s: dropped %d duplicate texts", c.train_file, dropped)
        if c.eval_file:
            train_rows, eval_rows = rows, read_texts(c.eval_file, c.text_field, c.text_unit)
            overlap = {r.text for r in train_rows} & {r.text for r in eval_rows}
            if overlap:
                log.warning("%d texts of %s are in %s", len(overlap), c.eval_file, c.train_file)
        else:
            if len(rows) < 2:
                raise ValueError(f"{c.train_file}: needs at least 2 texts to hold one out")
            train, held = stratified_split([0] * len(rows), c.eval_fraction, c.split_seed)
            train_rows, eval_rows = [rows[i] for i in train], [rows[i] for i in held]

        self.pad_id = cfg.pad_token_id if cfg.pad_token_id is not None else 0
        max_length = min(c.max_length, max_length_for(self.files, cfg.max_length))
        tokenizer = TextTokenizer.from_files(
            self.files, max_length, self.pad_id, vocab_size=cfg.vocab_size
        )
        self.vocab = masking_vocab(tokenizer, self.files, cfg.vocab_size)
        self.train_ids = self._tokenize(tokenizer, train_rows, c.train_file)
        self.eval_ids = self._tokenize(tokenizer, eval_rows, c.eval_file or c.train_file)
        self.train_lengths = [len(ids) for ids in self.train_ids]
        # Each text's count of masked tokens is fixed (which ones is drawn): the loss of a step
        # divides by their sum, known before the draw.
        self.train_scored = [masked_count(len(self.vocab.candidates(i))) for i in self.train_ids]
        # Masked once, by (split_seed, example): every evaluation scores the same positions.
        self.eval_masked = [
            mask_example(ids, self.vocab, generator(EVAL_STREAM, c.split_seed, 0, index))
            for index, ids in enumerate(self.eval_ids)
        ]
        self.eval_order = sorted(range(len(self.eval_ids)), key=lambda i: len(self.eval_ids[i]))

    def _tokenize(self, tokenizer, rows: list[LabelledText], source: str) -> list[list[int]]:
        """Token ids of each text that has a token to mask (one of only [UNK]s has none)."""
        encoded = [list(e.ids) for e in tokenizer.encode([r.text for r in rows])]
        kept = [ids for ids in encoded if len(self.vocab.candidates(ids))]
        if len(kept) < len(encoded):
            log.warning("%s: %d texts have no token to mask", source, len(encoded) - len(kept))
        if not kept:
            raise ValueError(f"{source}: no text has a token to mask")
        return kept

    def build_model(self) -> MaskedLanguageModel:
        return build_model(self.config, self.files)

    def train_batch(self, indices: Sequence[int]) -> MaskedBatch:
        return self.train_batch_at(indices, 0)

    def train_batch_at(self, indices: Sequence[int], step: int) -> MaskedBatch:
        """The examples at ``indices`` masked for optimizer step ``step`` (0-based)."""
        examples = [
            mask_example(
                self.train_ids[i], self.vocab, generator(TRAIN_STREAM, self.config.seed, step, i)
            )
            for i in indices
        ]
        return collate_masked(examples, packed=self._packed, pad_id=self.pad_id)

    def scored_positions(self, indices: Sequence[int]) -> int:
        """The masked tokens of these examples (the loss is their mean)."""
        return sum(self.train_scored[i] for i in indices)

    def eval_batches(self, batch_size: int) -> Iterator[MaskedBatch]:
        for start in range(0, len(self.eval_order), batch_size):
            chunk = self.eval_order[start : start + batch_size]
            examples = [self.eval_masked[i] for i in chunk]
            yield collate_masked(examples, packed=self._packed, pad_id=self.pad_id)

    @property
    def _packed(self) -> bool:
        return self.config.batching == "packed"

    def export(self, weights: dict[str, Any], run_dir: Path) -> Path:
        """The run's final weights as a transformers ``*ForMaskedLM`` directory, RUN/hf/."""
        return write_hf(self.config, self.files, weights, Path(run_dir) / "hf")

    def describe(self) -> dict:
        return {
            "task": self.name,
            "train_file": self.config.train_file,
            "eval_file": self.config.eval_file
            or f"held out of train_file ({self.config.eval_fraction:.0%})",
            "train_examples": len(self.train_ids),
            "eval_examples": len(self.eval_ids),
            "eval_masked_tokens": sum(len(chosen) for _, chosen, _ in self.eval_masked),
            "model": str(self.files.path),
            "from_scratch": self.config.from_scratch,
            "mean_tokens": sum(self.train_lengths) / len(self.train_lengths),
        }


def masking_vocab(tokenizer, files, vocab_size: int) -> MaskingVocab:
    """The tokenizer's ``[MASK]`` id and special tokens (tokenizer_config.json's
    ``mask_token``, else ``[MASK]`` or ``<mask>`` among its special tokens).

    Raises:
        ValueError: a tokenizer without a mask token.
    """
    added = tokenizer.tokenizer.get_added_tokens_decoder()  # id -> AddedToken
    special = {i: t.content for i, t in added.items() if t.special}
    named = files.tokenizer_config.get("mask_token")
    if isinstance(named, dict):  # transformers writes an AddedToken as a dict
        named = named.get("content")
    wanted = [named] if named else ["[MASK]", "<mask>"]
    ids = [i for i, text in special.items() if text in wanted]
    if not ids:
        raise ValueError(
            f"the tokenizer of {files.path} has no mask token (tried {wanted}); masked-LM "
            "training needs one"
        )
    return MaskingVocab.of(ids[0], list(special), vocab_size)


def build_model(config: TrainConfig, files, *, weights: bool = True) -> MaskedLanguageModel:
    """The masked LM a config describes: the checkpoint's encoder and head (a new head when it
    has none); ``from_scratch`` or ``weights=False``: the same shapes, random weights."""
    from ...heads import MaskedLMHead
    from ...interop.hf.loading import read_family
    from ...interop.hf.masked_lm import head_config, initialise_head, load_masked_lm

    if config.from_scratch or not weights:
        family, cfg = read_family(files, "auto")
        head = initialise_head(MaskedLMHead(head_config(family, files.config)), files.config)
        return MaskedLanguageModel(EncoderModel(cfg), head).train()
    loaded = load_masked_lm(files, new_head=True)
    return MaskedLanguageModel(loaded.loaded.model, loaded.head).train()


def write_hf(config: TrainConfig, files, weights: dict[str, Any], out: Path) -> Path:
    """``weights`` (a :class:`MaskedLanguageModel`'s) as a transformers ``*ForMaskedLM``
    directory with the checkpoint's config.json fields and tokenizer files."""
    from ...interop.hf.loading import read_family
    from ...interop.hf.masked_lm import copy_tokenizer_files, save_masked_lm

    model = build_model(config, files, weights=False)
    model.load_state_dict(weights, strict=True)
    family, _ = read_family(files, "auto")
    save_masked_lm(model.model.eval(), model.head.eval(), out, family, base_config=files.config)
    copy_tokenizer_files(files.path, out)
    log.info("wrote the masked LM to %s", out)
    return out


def export_hf(
    run: str | Path, out: str | Path | None = None, *, checkpoint: str | None = None
) -> Path:
    """Write an mlm run's model as a transformers ``*ForMaskedLM`` directory (default
    ``RUN/hf``), which ``AutoModelForMaskedLM.from_pretrained`` and
    :func:`clearformer.interop.hf.masked_lm.load_masked_lm` load.

    Args:
        checkpoint: None, the run's final weights (``RUN/model.safetensors``); ``best`` or
            ``latest``, the checkpoint that pointer names; or a folder name
            (``step-00000100``). Sharded (FSDP) checkpoints have no single weights file: only
            the final weights export.

    Raises:
        FileNotFoundError: no such run, or no such weights file in it.
        ValueError: the run is not an mlm run.
    """
    from safetensors.torch import load_file

    from ...interop.hf import find_checkpoint
    from ..checkpoint import read_pointer
    from ..tomlfile import load_config

    run = Path(run)
    config = load_config(run / "config.toml")
    if config.task != "mlm":
        raise ValueError(f"{run} is a {config.task!r} run: export_hf writes mlm runs only")
    if checkpoint is None:
        source = run / "model.safetensors"
    else:
        folders = run / "checkpoints"
        name = read_pointer(folders, checkpoint) if checkpoint in ("best", "latest") else None
        source = folders / (name or checkpoint) / "model.safetensors"
    if not source.is_file():
        raise FileNotFoundError(f"no weights to export: {source} does not exist")
    files = find_checkpoint(None if config.model == "bundled" else config.model)
    return write_hf(config, files, load_file(source), Path(out) if out else run / "hf")
