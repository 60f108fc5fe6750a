"""``reverse``: the seed's own demo. Random token sequences of varying length, and the model
learns to write each one backwards: an encoder-decoder task with a known right answer, so
exact-match is the metric that matters.

Tokens: 0 padding, 1 start, 2 end, then ``reverse_vocab`` symbols. Training and held-out
sequences are drawn from generators of their own seeds; a held-out sequence that also occurs in
training is dropped, so the held-out score measures generalisation, not recall. During training
the evaluation reports the loss and the token accuracy under teacher forcing; exact-match by
decoding is :func:`exact_match` (batched and one row at a time).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from ...generation import generate
from ...seq2seq import Seq2SeqTransformer
from ..config import TrainConfig
from .seq2seq_data import Seq2SeqBatch, Seq2SeqForTraining, collate_pairs, seq2seq_model

PAD, BOS, EOS, FIRST = 0, 1, 2, 3


def random_sequences(count: int, vocab: int, low: int, high: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, high + 1, (count,), generator=generator).tolist()
    return [
        (torch.randint(FIRST, FIRST + vocab, (n,), generator=generator)).tolist() for n in lengths
    ]


def build_model(c: TrainConfig) -> Seq2SeqForTraining:
    """The reversal model a config describes (what a run's weights load into): one vocabulary
    for both sides, the sequences reversed being the same symbols."""
    return seq2seq_model(
        c,
        src_vocab=FIRST + c.reverse_vocab,
        tgt_vocab=None,
        max_positions=c.reverse_max_length + 2,
        pad=PAD,
        bos=BOS,
        eos=EOS,
    )


class ReverseTask:
    name = "reverse"
    metric = "accuracy"  # token accuracy under teacher forcing
    metrics = ("accuracy",)

    def __init__(self, config: TrainConfig) -> None:
        self.config = config
        c = config
        train = random_sequences(
            c.reverse_examples, c.reverse_vocab, c.reverse_min_length, c.reverse_max_length, c.seed
        )
        seen = {tuple(s) for s in train}
        held = random_sequences(
            max(c.reverse_examples // 10, 1),
            c.reverse_vocab,
            c.reverse_min_length,
            c.reverse_max_length,
            c.split_seed + 1_000_003,  # never the training stream's seed
        )
        self.train_sources = train
        self.eval_sources = [s for s in held if tuple(s) not in seen]
        if not self.eval_sources:
            # Every held-out draw is a training sequence too: nothing would measure how the
            # model does on sequences it never saw (and the first evaluation had no batch).
            raise ValueError(
                f"no held-out sequence is left: every one of reverse_vocab={c.reverse_vocab}, "
                f"reverse_min_length={c.reverse_min_length} .. reverse_max_length="
                f"{c.reverse_max_length} is among the reverse_examples={c.reverse_examples} "
                "training sequences; raise reverse_vocab or the lengths"
            )
        self.labels = tuple(str(t) for t in range(FIRST + c.reverse_vocab))
        self.train_lengths = [2 * len(s) + 1 for s in train]

    def build_model(self) -> Seq2SeqForTraining:
        return build_model(self.config)

    def _batch(self, sources: Sequence[list[int]]) -> Seq2SeqBatch:
        return collate_pairs([(s, s[::-1]) for s in sources], pad=PAD, bos=BOS, eos=EOS)

    def train_batch(self, indices: Sequence[int]) -> Seq2SeqBatch:
        return self._batch([self.train_sources[i] for i in indices])

    def scored_positions(self, indices: Sequence[int]) -> int:
        """The target tokens of these examples (the reversed sequence and the end): the
        training loss is their mean, on the evaluation's scale."""
        return sum(len(self.train_sources[i]) + 1 for i in indices)

    def eval_batches(self, batch_size: int) -> Iterator[Seq2SeqBatch]:
        for start in range(0, len(self.eval_sources), batch_size):
            yield self._batch(self.eval_sources[start : start + batch_size])

    def describe(self) -> dict:
        c = self.config
        return {
            "task": self.name,
            "train_examples": len(self.train_sources),
            "eval_examples": len(self.eval_sources),
            "symbols": c.reverse_vocab,
            "lengths": [c.reverse_min_length, c.reverse_max_length],
        }


def exact_match(
    model: Seq2SeqTransformer,
    sources: Sequence[list[int]],
    *,
    batch_size: int = 64,
    num_beams: int = 1,
    one_at_a_time: bool = False,
) -> tuple[float, list[list[int]]]:
    """The fraction of ``sources`` decoded exactly into their reverse, and the decoded tokens
    (each without its end token). ``one_at_a_time`` decodes each row alone, unpadded."""
    model.eval()
    outputs: list[list[int]] = []
    step = 1 if one_at_a_time else batch_size
    for start in range(0, len(sources), step):
        chunk = sources[start : start + step]
        longest = max(len(s) for s in chunk)
        src = torch.full((len(chunk), longest), PAD, dtype=torch.long)
        for row, s in enumerate(chunk):
            src[row, : len(s)] = torch.tensor(s)
        mask = src != PAD
        out = generate(model, src, mask, max_new_tokens=longest + 1, num_beams=num_beams)
        for row, n in enumerate(out.lengths.tolist()):
            seq = out.sequences[row, :n].tolist()
            outputs.append(seq[:-1] if seq and seq[-1] == EOS else seq)
    hits = sum(o == s[::-1] for o, s in zip(outputs, sources, strict=True))
    return hits / max(len(sources), 1), outputs
