"""``classify``: text classification from a CSV or JSONL file of (text, label).

Fine-tunes a pretrained checkpoint (the bundled all-MiniLM-L6-v2 by default) with a pooled
linear head, or trains the same shape from scratch (``from_scratch``: the checkpoint's
tokenizer, random weights). Labels are the sorted label names of the training file; a label
met only in the evaluation file is an error naming its line. Without an ``eval_file``, a
stratified ``eval_fraction`` of the (deduplicated) training file is held out.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

import torch

from ...model import EncoderModel
from ..collate import PackedBatch, PaddedBatch, pack_sequences, pad_sequences
from ..config import TrainConfig
from ..models import TextClassifier
from .base import stratified_split
from .text_data import LabelledText, deduplicate, read_labelled

log = logging.getLogger(__name__)


class ClassifyTask:
    name = "classify"
    metric = "accuracy"
    metrics = ("accuracy", "macro_f1")

    def __init__(self, config: TrainConfig) -> None:
        from ...interop.hf import find_checkpoint
        from ...interop.hf.loading import read_family
        from ...interop.hf.tokenizer import TextTokenizer, max_length_for

        self.config = config
        rows = read_labelled(config.train_file, config.text_field, config.label_field)
        rows, dropped, conflicts = deduplicate(rows, config.train_file)
        if dropped:
            log.warning(
                "%s: dropped %d duplicate texts (%d with another label)",
                config.train_file,
                dropped,
                conflicts,
            )
        self.labels = tuple(sorted({r.label for r in rows}))
        if len(self.labels) < 2:
            raise ValueError(f"{config.train_file}: needs at least 2 labels, got {self.labels}")
        if config.eval_file:
            train_rows = rows
            eval_rows = read_labelled(config.eval_file, config.text_field, config.label_field)
            self._check_labels(eval_rows, config.eval_file)
            overlap = {r.text for r in train_rows} & {r.text for r in eval_rows}
            if overlap:
                log.warning(
                    "%d texts of %s are also in %s",
                    len(overlap),
                    config.eval_file,
                    config.train_file,
                )
        else:
            ids = [self.labels.index(r.label) for r in rows]
            train, held = stratified_split(ids, config.eval_fraction, config.split_seed)
            if not held:  # a label's only example is never held out: there would be no score
                raise ValueError(
                    f"{config.train_file}: no example to hold out for evaluation: each of the "
                    f"{len(self.labels)} labels has one example (eval_fraction holds out part "
                    "of a label's examples when it has two or more); give more examples or "
                    "an eval_file"
                )
            train_rows, eval_rows = [rows[i] for i in train], [rows[i] for i in held]

        self.files = find_checkpoint(None if config.model == "bundled" else config.model)
        self.family, self.encoder_config = read_family(self.files, "auto")
        cfg = self.encoder_config
        self.pad_id = cfg.pad_token_id if cfg.pad_token_id is not None else 0
        max_length = min(config.max_length, max_length_for(self.files, cfg.max_length))
        tokenizer = TextTokenizer.from_files(
            self.files, max_length, self.pad_id, vocab_size=cfg.vocab_size
        )
        self.train_ids = self._tokenize(tokenizer, train_rows)
        self.eval_ids = self._tokenize(tokenizer, eval_rows)
        self.train_y = [self.labels.index(r.label) for r in train_rows]
        self.eval_y = [self.labels.index(r.label) for r in eval_rows]
        self.train_lengths = [len(ids) for ids in self.train_ids]
        # Evaluation in order of length: fewer padded positions, same results.
        self.eval_order = sorted(range(len(self.eval_ids)), key=lambda i: len(self.eval_ids[i]))

    def _check_labels(self, rows: list[LabelledText], source: str) -> None:
        for row in rows:
            if row.label not in self.labels:
                raise ValueError(
                    f"{source} line {row.line}: label {row.label!r} is not among the training "
                    f"file's labels {list(self.labels)}"
                )

    @staticmethod
    def _tokenize(tokenizer, rows: list[LabelledText]) -> list[list[int]]:
        return [list(e.ids) for e in tokenizer.encode([r.text for r in rows])]

    def build_model(self) -> TextClassifier:
        from ...interop.hf.loading import build_model
        from ...interop.hf.weights import open_tensors

        c = self.config
        cfg = self.encoder_config  # checkpointing is the trainer's per-call choice, not here
        if c.from_scratch:
            model = EncoderModel(cfg)
        else:
            loaded = build_model(
                self.files, self.family, cfg, open_tensors(self.files.weights), strict=True
            )
            model = loaded.model
        return TextClassifier(model, len(self.labels), c.pooling, c.dropout).train()

    def _collate(self, ids, labels) -> PackedBatch | PaddedBatch:
        if self.config.batching == "packed":
            return pack_sequences(ids, labels)  # no padding at all
        return pad_sequences(ids, labels, self.pad_id)

    def train_batch(self, indices: Sequence[int]) -> PackedBatch | PaddedBatch:
        return self._collate(
            [self.train_ids[i] for i in indices], [self.train_y[i] for i in indices]
        )

    def eval_batches(self, batch_size: int) -> Iterator[PackedBatch | PaddedBatch]:
        for start in range(0, len(self.eval_order), batch_size):
            chunk = self.eval_order[start : start + batch_size]
            yield self._collate([self.eval_ids[i] for i in chunk], [self.eval_y[i] for i in chunk])

    def describe(self) -> dict:
        counts = torch.bincount(torch.tensor(self.train_y), minlength=len(self.labels))
        return {
            "task": self.name,
            "train_file": self.config.train_file,
            "eval_file": self.config.eval_file
            or f"held out of train_file ({self.config.eval_fraction:.0%}, stratified)",
            "train_examples": len(self.train_y),
            "eval_examples": len(self.eval_y),
            "labels": list(self.labels),
            "train_label_counts": counts.tolist(),
            "model": str(self.files.path),
            "from_scratch": self.config.from_scratch,
            "mean_tokens": sum(self.train_lengths) / len(self.train_lengths),
        }
