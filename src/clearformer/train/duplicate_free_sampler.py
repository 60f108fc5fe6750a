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
        self.texts = [frozenset(t) for t in texts]
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
        batches: list[list[int]] = []
        waiting: deque[int] = deque()
        batch: list[int] = []
        seen: set[str] = set()

        def close() -> None:
            nonlocal batch, seen
            batches.append(batch)
            batch, seen = [], set()
            # Waiting examples go first into the new batch, in the order they waited.
            for _ in range(len(waiting)):
                index = waiting.popleft()
                if len(batch) < self.batch_size and not (self.texts[index] & seen):
                    batch.append(index)
                    seen.update(self.texts[index])
                else:
                    waiting.append(index)

        for index in order:
            if self.texts[index] & seen:
                waiting.append(index)
                continue
            batch.append(index)
            seen.update(self.texts[index])
            if len(batch) == self.batch_size:
                close()
        while len(batch) == self.batch_size:  # waiting examples may fill more batches
            close()
        return batches
