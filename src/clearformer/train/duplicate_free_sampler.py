"""A seeded, resumable batch sampler that never puts the same text twice in a batch.

With in-batch negatives, every other row's positive is a negative for an anchor: two rows
sharing a text (the same positive for two paraphrased anchors, say) would teach the model that
a text is not relevant to itself. Each epoch shuffles the examples and fills batches in that
order; an example with a text already in the open batch waits, and is taken first into the
next batch that has room for it (sentence-transformers' ``NoDuplicatesBatchSampler`` does the
same). Every batch is full: an epoch's last, incomplete batch is left out, and its examples
come in the next epoch's shuffle.

Resuming is :class:`~.sampler.EpochSampler`'s.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import torch

from .sampler import EpochSampler


class DuplicateFreeSampler(EpochSampler):
    """Batches of example indices whose texts are all different, one epoch after another."""

    def __init__(self, texts: Sequence[Sequence[str]], batch_size: int, *, seed: int) -> None:
        super().__init__(len(texts), batch_size, seed)
        # Compared as the tokenizer reads them (as the pairs reader compares a row's texts):
        # "a text " and "a text" in one batch would each be the other's negative.
        self.texts = [frozenset(text.strip() for text in row) for row in texts]
        self._start()
        if not self._batches:
            raise ValueError(
                f"batch_size {batch_size} cannot be filled with distinct texts: the examples "
                "share too many texts"
            )

    def _identity(self) -> dict:
        return {"batch_size": self.batch_size, "size": len(self.texts)}

    def _make_epoch(self) -> list[list[int]]:
        order = torch.randperm(len(self.texts), generator=self.generator).tolist()
        return duplicate_free_batches(order, self.texts, self.batch_size)


def duplicate_free_batches(
    order: Sequence[int], texts: Sequence[frozenset[str]], batch_size: int
) -> list[list[int]]:
    """Full batches of ``order``'s indices whose ``texts`` are all different: an index whose
    texts meet the open batch's waits, and the waiting indices go first, in the order they
    waited, into each new batch that has room for them. The indices left at the end (a last
    incomplete batch and those still waiting) are not in any batch."""
    batches: list[list[int]] = []
    waiting: deque[int] = deque()
    batch: list[int] = []
    seen: set[str] = set()

    def close() -> None:
        nonlocal batch, seen
        # The waiting indices may fill the new batch at once, and then the next one.
        while len(batch) == batch_size:
            batches.append(batch)
            batch, seen = [], set()
            for _ in range(len(waiting)):
                index = waiting.popleft()
                if len(batch) < batch_size and not (texts[index] & seen):
                    batch.append(index)
                    seen.update(texts[index])
                else:
                    waiting.append(index)

    for index in order:
        if texts[index] & seen:
            waiting.append(index)
            continue
        batch.append(index)
        seen.update(texts[index])
        close()
    return batches
