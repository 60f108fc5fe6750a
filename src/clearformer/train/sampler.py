"""A seeded, resumable, length-bucketed batch sampler.

Each epoch: shuffle all examples, cut the shuffled order into pools of ``bucket`` batches,
sort each pool by length and cut it into batches (so batch-mates have similar lengths and
little padding), then shuffle the batches (so the model does not see short-then-long within
a pool). All randomness comes from the sampler's own ``torch.Generator``, never the global RNG,
so data order does not depend on the model's dropout or on its initialisation.

Resuming needs only two things: the generator's state at the start of the epoch and the number
of batches already taken in it. The epoch's batches are then rebuilt exactly and the taken ones
skipped, so a resumed run sees the same batches as an uninterrupted one.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..checks import check_int, check_positive_int

EMPTY_EPOCHS_MAX = 100  # shuffles tried in a row before an epoch without a batch is an error


class EpochSampler:
    """Batches of example indices, one epoch after another, forever (``next_batch``), from a
    generator of the sampler's own; a subclass says how one epoch is cut (``_make_epoch``).

    Resuming needs the generator's state at the start of the epoch and the batches taken: the
    epoch is rebuilt exactly and the taken batches skipped. ``_identity`` names what a state
    must match (batch size, examples, ...).
    """

    def __init__(self, size: int, batch_size: int, seed: int) -> None:
        check_positive_int(batch_size, "batch_size")
        check_int(seed, "seed")
        if batch_size > size:
            raise ValueError(
                f"batch_size must be at most the number of examples ({size}), got {batch_size}"
            )
        self.batch_size = batch_size
        self.generator = torch.Generator().manual_seed(seed)
        self.epoch = 0
        self.position = 0  # batches taken in this epoch
        self._epoch_start_state = self.generator.get_state()
        self._batches: list[list[int]] = []

    def _start(self) -> None:
        """Cut the first epoch (after the subclass has set what ``_make_epoch`` reads)."""
        self._batches = self._make_epoch()

    def _make_epoch(self) -> list[list[int]]:
        raise NotImplementedError

    def _identity(self) -> dict:
        raise NotImplementedError

    @property
    def batches_per_epoch(self) -> int:
        return len(self._batches)

    def epoch_batches(self) -> list[list[int]]:
        """The current epoch's batches, in order (all of them, taken or not)."""
        return [list(b) for b in self._batches]

    def next_batch(self) -> list[int]:
        """The next batch of indices; a new epoch begins after the last batch of one."""
        if self.position == len(self._batches):
            # An epoch may cut no batch at all (a shuffle in which examples that share texts
            # never leave room for each other): the next shuffle is tried, a bounded number of
            # times.
            for _ in range(EMPTY_EPOCHS_MAX):
                self.epoch += 1
                self.position = 0
                self._epoch_start_state = self.generator.get_state()
                self._batches = self._make_epoch()
                if self._batches:
                    break
            else:
                raise ValueError(
                    f"{EMPTY_EPOCHS_MAX} epochs in a row cut no batch of batch_size "
                    f"{self.batch_size}: the examples share too many texts for it"
                )
        batch = self._batches[self.position]
        self.position += 1
        return list(batch)

    def state_dict(self) -> dict:
        """Where the sampler is: the epoch, the generator at its start, batches taken."""
        return {
            "epoch": self.epoch,
            "position": self.position,
            "epoch_start_generator": self._epoch_start_state.clone(),
            **self._identity(),
        }

    def load_state_dict(self, state: dict) -> None:
        mine = self._identity()
        theirs = {key: state.get(key) for key in mine}
        if mine != theirs:
            names = ", ".join("examples" if key == "size" else key for key in mine)
            raise ValueError(
                f"the sampler state is for ({names}) = {tuple(theirs.values())}, this sampler "
                f"has {tuple(mine.values())}"
            )
        self.epoch = int(state["epoch"])
        self._epoch_start_state = state["epoch_start_generator"].clone()
        self.generator.set_state(self._epoch_start_state)
        self._batches = self._make_epoch()  # the epoch again, exactly, from its start state
        self.position = int(state["position"])


class BucketSampler(EpochSampler):
    """Length-bucketed batches (see the module docstring)."""

    def __init__(
        self, lengths: Sequence[int], batch_size: int, *, seed: int, bucket: int = 50
    ) -> None:
        check_positive_int(bucket, "bucket")
        super().__init__(len(lengths), batch_size, seed)
        self.lengths = torch.as_tensor(list(lengths), dtype=torch.int64)
        self.bucket = bucket
        self._start()

    def _identity(self) -> dict:
        return {"batch_size": self.batch_size, "bucket": self.bucket, "size": len(self.lengths)}

    def _make_epoch(self) -> list[list[int]]:
        order = torch.randperm(len(self.lengths), generator=self.generator)
        pool = self.batch_size * self.bucket
        batches = []
        for start in range(0, len(order), pool):
            chunk = order[start : start + pool]
            # stable sort: equal lengths keep their shuffled order (deterministic either way)
            chunk = chunk[torch.sort(self.lengths[chunk], stable=True).indices]
            batches.extend(
                chunk[i : i + self.batch_size].tolist()
                for i in range(0, len(chunk), self.batch_size)
            )
        shuffle = torch.randperm(len(batches), generator=self.generator)
        return [batches[i] for i in shuffle.tolist()]


def padding_fraction(batches: Sequence[Sequence[int]], lengths: Sequence[int]) -> float:
    """The share of positions that are padding when each batch is padded to its longest."""
    lengths = list(lengths)
    real = padded = 0
    for batch in batches:
        longest = max(lengths[i] for i in batch)
        real += sum(lengths[i] for i in batch)
        padded += longest * len(batch)
    return 1.0 - real / padded if padded else 0.0


def random_batches(size: int, batch_size: int, seed: int) -> list[list[int]]:
    """One epoch of plain shuffled batches, to compare bucketing's padding against."""
    order = torch.randperm(size, generator=torch.Generator().manual_seed(seed)).tolist()
    return [order[i : i + batch_size] for i in range(0, size, batch_size)]
