"""A seeded, resumable batch sampler that never puts the same text twice in a batch.

With in-batch negatives, every other row's positive is a negative for an anchor: two rows
sharing a text (the same positive for two paraphrased anchors, say) would teach the model that
a text is not relevant to itself. Each epoch shuffles the examples and fills batches in that
order; an example with a text already in the open batch waits, and is taken first into the
next batch that has room for it (sentence-transformers' ``NoDuplicatesBatchSampler`` does the
same). Every batch is full: an epoch's last, incomplete batch is left out, and its examples
come in the next epoch's shuffle.

Resuming needs the generator's state at the start of the epoch and the batches taken, as
:class:`~.sampler.BucketSampler`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import torch

from ..checks import check_int, check_positive_int


class DuplicateFreeSampler:
    """Batches of example indices whose texts are all different, one epoch after another."""

    def __init__(self, texts: Sequence[Sequence[str]], batch_size: int, *, seed: int) -> None:
        check_positive_int(batch_size, "batch_size")
        check_int(seed, "seed")
        if batch_size > len(texts):
            raise ValueError(
                f"batch_size must be at most the number of examples ({len(texts)}), "
                f"got {batch_size}"
            )
        self.texts = [frozenset(t) for t in texts]
        self.batch_size = batch_size
        self.generator = torch.Generator().manual_seed(seed)
        self.epoch = 0
        self.position = 0
        self._epoch_start_state = self.generator.get_state()
        self._batches = self._make_epoch()
        if not self._batches:
            raise ValueError(
                f"batch_size {batch_size} cannot be filled with distinct texts: the examples "
                "share too many texts"
            )

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

    @property
    def batches_per_epoch(self) -> int:
        return len(self._batches)

    def epoch_batches(self) -> list[list[int]]:
        return [list(b) for b in self._batches]

    def next_batch(self) -> list[int]:
        if self.position == len(self._batches):
            self.epoch += 1
            self.position = 0
            self._epoch_start_state = self.generator.get_state()
            self._batches = self._make_epoch()
        batch = self._batches[self.position]
        self.position += 1
        return list(batch)

    def state_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "epoch_start_generator": self._epoch_start_state.clone(),
            "batch_size": self.batch_size,
            "bucket": 0,
            "size": len(self.texts),
        }

    def load_state_dict(self, state: dict) -> None:
        mine = (self.batch_size, len(self.texts))
        theirs = (state["batch_size"], state["size"])
        if mine != theirs:
            raise ValueError(
                f"the sampler state is for (batch_size, examples) = {theirs}, this sampler "
                f"has {mine}"
            )
        self.epoch = int(state["epoch"])
        self._epoch_start_state = state["epoch_start_generator"].clone()
        self.generator.set_state(self._epoch_start_state)
        self._batches = self._make_epoch()
        self.position = int(state["position"])
