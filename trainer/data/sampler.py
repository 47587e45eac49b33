"""The data order: which dataset sample each stream position trains on.

Both parts are pure functions of their inputs, never of world size, batch
size or call history, so that rolling back, skipping a window and resuming
replay exactly the same samples:

* :class:`EpochShuffle` maps stream position ``p`` to dataset sample
  ``perm_e[p % n]`` where ``e = p // n`` and ``perm_e`` is a permutation of
  ``range(n)`` seeded by ``(seed, e)``;
* :class:`SkipSchedule` walks the stream from a cursor, jumping over the
  skip ranges (positions ``[start, end)`` never trained on).
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from typing import Iterable

import numpy as np

from trainer.data.errors import DataError


class EpochShuffle:
    """Position -> dataset sample, a fresh permutation per epoch.

    Permutations come from numpy's PCG64 seeded by ``(seed, epoch)``; they are
    computed on first use and the most recent ``cached_epochs`` are kept.
    """

    def __init__(self, num_samples: int, seed: int, cached_epochs: int = 2) -> None:
        if num_samples <= 0:
            raise ValueError(f"num_samples must be positive, got {num_samples}")
        self.num_samples = num_samples
        self.seed = seed
        self._cached_epochs = max(1, cached_epochs)
        self._permutations: OrderedDict[int, np.ndarray] = OrderedDict()

    def dataset_index(self, position: int) -> int:
        """The dataset sample trained on at stream ``position``."""
        if position < 0:
            raise ValueError(f"stream position must be >= 0, got {position}")
        epoch, offset = divmod(position, self.num_samples)
        return int(self.permutation(epoch)[offset])

    def permutation(self, epoch: int) -> np.ndarray:
        """The order of the dataset's samples in ``epoch`` (read-only)."""
        cached = self._permutations.get(epoch)
        if cached is None:
            cached = epoch_permutation(self.num_samples, self.seed, epoch)
            self._permutations[epoch] = cached
            while len(self._permutations) > self._cached_epochs:
                self._permutations.popitem(last=False)
        else:
            self._permutations.move_to_end(epoch)
        return cached


def epoch_permutation(num_samples: int, seed: int, epoch: int) -> np.ndarray:
    """A permutation of ``range(num_samples)`` that depends only on its arguments."""
    # SeedSequence takes non-negative entropy; fold a negative seed into 64 bits.
    generator = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed % 2**64, epoch])))
    order = generator.permutation(num_samples)
    order.flags.writeable = False
    return order


class SkipSchedule:
    """Stream positions to train on: every position not in a skip range."""

    def __init__(self, skip_ranges: Iterable = ()) -> None:
        merged = merge_skip_ranges(skip_ranges)
        self.ranges: tuple[tuple[int, int], ...] = merged
        """Merged, sorted, non-empty ``(start, end)`` pairs."""
        self._starts = [start for start, _ in merged]
        self._ends = [end for _, end in merged]

    def is_skipped(self, position: int) -> bool:
        return self._skip_end(position) != position

    def take(self, cursor: int, count: int) -> tuple[list[int], int]:
        """The first ``count`` positions at or after ``cursor`` that are not
        skipped, and the new cursor (one past the last position taken)."""
        if cursor < 0 or count < 0:
            raise ValueError(f"cursor and count must be >= 0, got cursor={cursor} count={count}")
        taken: list[int] = []
        position = cursor
        while len(taken) < count:
            position = self._skip_end(position)
            next_range = bisect.bisect_right(self._starts, position)
            limit = self._starts[next_range] if next_range < len(self._starts) else None
            run = count - len(taken) if limit is None else min(count - len(taken), limit - position)
            taken.extend(range(position, position + run))
            position += run
        return taken, (taken[-1] + 1 if taken else cursor)

    def _skip_end(self, position: int) -> int:
        """``position`` itself, or the end of the skip range that holds it."""
        index = bisect.bisect_right(self._starts, position) - 1
        if index >= 0 and position < self._ends[index]:
            return self._ends[index]
        return position


def merge_skip_ranges(skip_ranges: Iterable) -> tuple[tuple[int, int], ...]:
    """Sorted, merged ``(start, end)`` pairs from SkipRange objects or pairs;
    empty ranges are dropped, malformed ones raise :class:`DataError`."""
    pairs = []
    for item in skip_ranges:
        start, end = (item.start, item.end) if hasattr(item, "start") else item
        start, end = int(start), int(end)
        if start < 0 or end < start:
            raise DataError(f"skip range [{start}, {end}) is invalid: need 0 <= start <= end "
                            "(stream positions, end exclusive); fix the resume plan's skip_ranges")
        if end > start:
            pairs.append((start, end))
    merged: list[tuple[int, int]] = []
    for start, end in sorted(pairs):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return tuple(merged)
