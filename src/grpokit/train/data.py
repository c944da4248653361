"""The prompt stream: a seeded, resumable order over the training examples, and each rank's share of it.

Epoch e visits the examples in the order of a permutation seeded by (seed, e); the only state is a
cursor (how many prompts were drawn so far), so a checkpoint that stores the cursor resumes with
exactly the same prompts in the same order.
"""

from __future__ import annotations

from typing import Any, Generic, Sequence, TypeVar

import torch

T = TypeVar("T")


class PromptStream(Generic[T]):
    """Endless, reproducible draws of examples without replacement inside each epoch."""

    def __init__(self, examples: Sequence[T], seed: int, cursor: int = 0, shuffle: bool = True) -> None:
        if not examples:
            raise ValueError("the training split is empty: check task.name / task.path / task.train_split")
        self.examples = examples
        self.seed = seed
        self.cursor = cursor
        self.shuffle = shuffle   # False: every epoch in the data's own order (task.shuffle)
        self._epoch = -1
        self._order: list[int] = []

    def _order_for(self, epoch: int) -> list[int]:
        if epoch != self._epoch:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._order = torch.randperm(len(self.examples), generator=g).tolist() if self.shuffle else \
                list(range(len(self.examples)))
            self._epoch = epoch
        return self._order

    def take(self, n: int) -> list[T]:
        """The next n examples (crossing into the next epoch's permutation when needed)."""
        out = []
        for _ in range(n):
            epoch, pos = divmod(self.cursor, len(self.examples))
            out.append(self.examples[self._order_for(epoch)[pos]])
            self.cursor += 1
        return out


class ShardedStream:
    """Rank r's view of a shared `PromptStream`: take(n) draws n * W prompts and keeps slice r.

    Every rank holds the same stream (same seed), so the cursor (the count of prompts drawn by all
    ranks together) is the same everywhere and a checkpoint of it resumes every rank.
    """

    def __init__(self, stream: Any, rank: int, world_size: int) -> None:
        self.stream, self.rank, self.world_size = stream, rank, world_size

    cursor = property(lambda self: self.stream.cursor, lambda self, v: setattr(self.stream, "cursor", v))
    examples = property(lambda self: self.stream.examples)

    def take(self, n: int) -> list:
        """This rank's n prompts of the next n * W (whole groups: each prompt's G completions stay here)."""
        drawn = self.stream.take(n * self.world_size)
        return drawn[self.rank * n:(self.rank + 1) * n]
