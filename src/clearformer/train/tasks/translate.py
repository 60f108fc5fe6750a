"""``translate``: sentence pairs on :class:`~clearformer.Seq2SeqTransformer`, word by word.

Data. ``train_file`` is a TSV or JSONL file of (``source_field``, ``target_field``) pairs
(``parallel_data.py``), or ``"auf-deutsch"``, that package's German-English pairs
(``auf_deutsch.py``). Pairs that tokenise alike are kept once. Without an ``eval_file``,
``eval_fraction`` of the distinct source sentences is held out with all their translations
(``split_by_source``, ``split_seed``), so no source is in both halves. Pairs with a sentence of
more than ``translate_max_length`` words are left out of both halves, and counted.

Vocabularies. One per side, built from the training half only (a held-out word the model never
saw is ``<unk>``, as it would be in use). Separate rather than shared: the output layer (tied
to the target embeddings) then ranks English words only, and each language's rare words are
cut by its own counts; what a shared table would buy, one vector for a name or number spelt
alike in both languages, matters little next to that. The run folder keeps both in
``vocabulary.json``, and a resume whose data would build other vocabularies is refused.

Evaluation during training is loss and token accuracy under teacher forcing, as ``reverse``;
BLEU needs decoding and is :func:`held_out_bleu` (batched, greedy or beam).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

import torch

from ...generation import generate
from ...seq2seq import Seq2SeqTransformer
from ..bleu import BleuScore, corpus_bleu
from ..config import TrainConfig
from ..sampler import BucketSampler, random_batches
from .parallel_data import Pair, deduplicate_pairs, read_pairs, split_by_source
from .seq2seq_data import (
    Seq2SeqBatch,
    Seq2SeqForTraining,
    collate_pairs,
    pair_padding,
    seq2seq_model,
)
from .words import (
    BOS,
    EOS,
    PAD,
    Vocabulary,
    dump_vocabularies,
    join_words,
    split_words,
)

log = logging.getLogger(__name__)
VOCABULARY_FILE = "vocabulary.json"


def load_pairs(path: str, source_field: str, target_field: str) -> list[Pair]:
    from . import auf_deutsch

    if path == auf_deutsch.NAME:
        return auf_deutsch.read_auf_deutsch()
    return read_pairs(path, source_field, target_field)


def build_model(c: TrainConfig, source_words: int, target_words: int) -> Seq2SeqForTraining:
    """The translation model a config and its vocabulary sizes describe."""
    return seq2seq_model(
        c,
        src_vocab=source_words,
        tgt_vocab=target_words,  # given, even if equal: two tables, see above
        max_positions=c.translate_max_length + 2,  # start + words + end
        pad=PAD,
        bos=BOS,
        eos=EOS,
    )


class TranslateTask:
    name = "translate"
    metric = "accuracy"  # token accuracy under teacher forcing
    metrics = ("accuracy",)

    def __init__(self, config: TrainConfig) -> None:
        self.config = c = config
        pairs, self.duplicates = deduplicate_pairs(
            load_pairs(c.train_file, c.source_field, c.target_field)
        )
        if self.duplicates:
            log.info("%s: dropped %d duplicate pairs", c.train_file, self.duplicates)
        if c.eval_file:
            train_pairs = pairs
            eval_pairs, _ = deduplicate_pairs(
                load_pairs(c.eval_file, c.source_field, c.target_field)
            )
            overlap = {p.key for p in train_pairs} & {p.key for p in eval_pairs}
            if overlap:
                log.warning(
                    "%d sources of %s are also in %s", len(overlap), c.eval_file, c.train_file
                )
        else:
            if len({p.key for p in pairs}) < 2:
                raise ValueError(f"{c.train_file}: needs at least 2 distinct source sentences")
            train_pairs, eval_pairs = split_by_source(pairs, c.eval_fraction, c.split_seed)
        self.train_pairs, long_train = self._short_enough(train_pairs)
        self.eval_pairs, long_eval = self._short_enough(eval_pairs)
        self.too_long = long_train + long_eval
        if self.too_long:
            log.warning(
                "left out %d pairs with a sentence above translate_max_length=%d words",
                self.too_long,
                c.translate_max_length,
            )
        for half, name in ((self.train_pairs, "training"), (self.eval_pairs, "held-out")):
            if not half:
                raise ValueError(f"{c.train_file}: no {name} pairs left (translate_max_length?)")
        size = {"min_count": c.vocab_min_count, "max_size": c.vocab_max_size}
        self.source_vocab = Vocabulary.build(
            (split_words(p.source) for p in self.train_pairs), **size
        )
        self.target_vocab = Vocabulary.build(
            (split_words(p.target) for p in self.train_pairs), **size
        )
        self.train_ids = [self._ids(p) for p in self.train_pairs]
        self.eval_ids = [self._ids(p) for p in self.eval_pairs]
        self.train_lengths = [len(s) + len(t) + 1 for s, t in self.train_ids]
        # Evaluation in order of length: less padding, the same results.
        lengths = [len(s) + len(t) for s, t in self.eval_ids]
        self.eval_order = sorted(range(len(lengths)), key=lengths.__getitem__)
        self.labels = self.target_vocab.tokens

    def _short_enough(self, pairs: list[Pair]) -> tuple[list[Pair], int]:
        limit = self.config.translate_max_length
        kept = [
            p for p in pairs if max(len(split_words(p.source)), len(split_words(p.target))) <= limit
        ]
        return kept, len(pairs) - len(kept)

    def _ids(self, pair: Pair) -> tuple[list[int], list[int]]:
        return (
            self.source_vocab.encode(split_words(pair.source)),
            self.target_vocab.encode(split_words(pair.target)),
        )

    def build_model(self) -> Seq2SeqForTraining:
        return build_model(self.config, len(self.source_vocab), len(self.target_vocab))

    def run_files(self) -> dict[str, bytes]:
        """What decoding needs beside the weights: the vocabularies."""
        text = dump_vocabularies(self.source_vocab, self.target_vocab)
        return {VOCABULARY_FILE: text.encode("utf-8")}

    def train_batch(self, indices: Sequence[int]) -> Seq2SeqBatch:
        return collate_pairs([self.train_ids[i] for i in indices], pad=PAD, bos=BOS, eos=EOS)

    def scored_positions(self, indices: Sequence[int]) -> int:
        """The target tokens of these pairs (the translation's words and the end): the
        training loss is their mean, on the evaluation's scale."""
        return sum(len(self.train_ids[i][1]) + 1 for i in indices)

    def eval_batches(self, batch_size: int) -> Iterator[Seq2SeqBatch]:
        for start in range(0, len(self.eval_order), batch_size):
            chunk = self.eval_order[start : start + batch_size]
            yield collate_pairs([self.eval_ids[i] for i in chunk], pad=PAD, bos=BOS, eos=EOS)

    def held_out(self) -> tuple[list[list[int]], list[list[str]]]:
        """The distinct held-out sources (ids) and, for each, all its reference translations."""
        references: dict[tuple[str, ...], list[str]] = {}
        sources: dict[tuple[str, ...], list[int]] = {}
        for pair, (src, _) in zip(self.eval_pairs, self.eval_ids, strict=True):
            references.setdefault(pair.key, []).append(pair.target)
            sources.setdefault(pair.key, src)
        return list(sources.values()), list(references.values())

    def padding(self, batch_size: int, seed: int) -> dict[str, dict[str, float]]:
        """The padding of one epoch of the trainer's length-bucketed batches and of plain
        shuffled ones, as :func:`collate_pairs` pads them."""
        src = [len(s) for s, _ in self.train_ids]
        tgt = [len(t) for _, t in self.train_ids]
        bucketed = BucketSampler(self.train_lengths, batch_size, seed=seed).epoch_batches()
        shuffled = random_batches(len(self.train_ids), batch_size, seed)
        return {
            "bucketed": pair_padding(bucketed, src, tgt),
            "shuffled": pair_padding(shuffled, src, tgt),
        }

    def describe(self) -> dict:
        c = self.config
        eval_words = [w for p in self.eval_pairs for w in split_words(p.source)]
        return {
            "task": self.name,
            "train_file": c.train_file,
            "eval_file": c.eval_file
            or f"held out of train_file ({c.eval_fraction:.0%} of the distinct sources)",
            "train_pairs": len(self.train_pairs),
            "eval_pairs": len(self.eval_pairs),
            "train_sources": len({p.key for p in self.train_pairs}),
            "eval_sources": len({p.key for p in self.eval_pairs}),
            "duplicates_dropped": self.duplicates,
            "too_long_dropped": self.too_long,
            "source_vocabulary": len(self.source_vocab),
            "target_vocabulary": len(self.target_vocab),
            "eval_source_unknown_fraction": len(self.source_vocab.unknown(eval_words))
            / max(len(eval_words), 1),
            "seq2seq_padding": self.padding(c.batch_size, c.seed),
        }


def translate_ids(
    model: Seq2SeqTransformer,
    sources: Sequence[list[int]],
    *,
    max_new_tokens: int,
    num_beams: int = 1,
    batch_size: int = 64,
) -> list[list[int]]:
    """Decoded target ids of each source (without the end token), in the sources' order.
    Sources are decoded in order of length, ``batch_size`` at a time (less padding)."""
    model.eval()
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    outputs: dict[int, list[int]] = {}
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        longest = max(len(sources[i]) for i in chunk)
        src = torch.full((len(chunk), longest), PAD, dtype=torch.long)  # (B, S)
        for row, i in enumerate(chunk):
            src[row, : len(sources[i])] = torch.tensor(sources[i])
        out = generate(model, src, src != PAD, max_new_tokens=max_new_tokens, num_beams=num_beams)
        for row, (i, n) in enumerate(zip(chunk, out.lengths.tolist(), strict=True)):
            seq = out.sequences[row, :n].tolist()
            outputs[i] = seq[:-1] if seq and seq[-1] == EOS else seq
    return [outputs[i] for i in range(len(sources))]


def held_out_bleu(
    model: Seq2SeqTransformer,
    task: TranslateTask,
    *,
    num_beams: int = 1,
    batch_size: int = 64,
) -> tuple[BleuScore, list[str]]:
    """Corpus BLEU of the decoded held-out sources against all their references, and the
    decoded texts. Lower-cased (the model writes lower case) and 13a-tokenised, sacreBLEU's
    default otherwise; the output is :func:`join_words`-ed first, so BLEU's tokeniser sees the
    text it would see in the references."""
    sources, references = task.held_out()
    decoded = translate_ids(
        model,
        sources,
        max_new_tokens=task.config.translate_max_length + 1,
        num_beams=num_beams,
        batch_size=batch_size,
    )
    texts = [join_words(task.target_vocab.decode(ids)) for ids in decoded]
    return corpus_bleu(texts, references, lowercase=True), texts
