"""Data order: a pure function of (seed, position); skip ranges jumped over."""

from __future__ import annotations

import numpy as np
import pytest

from trainer.data import DataError
from trainer.data.sampler import EpochShuffle, SkipSchedule, merge_skip_ranges
from trainer.plan import SkipRange


def test_each_epoch_is_a_permutation_and_epochs_differ():
    order = EpochShuffle(num_samples=50, seed=7)
    epoch0 = [order.dataset_index(p) for p in range(50)]
    epoch1 = [order.dataset_index(p) for p in range(50, 100)]
    assert sorted(epoch0) == sorted(epoch1) == list(range(50))
    assert epoch0 != epoch1 and epoch0 != list(range(50))


def test_order_depends_only_on_seed_and_position():
    positions = list(range(0, 400, 3))
    forward = EpochShuffle(37, seed=11)
    expected = [forward.dataset_index(p) for p in positions]
    # A fresh object asked in reverse, jumping across epochs, with a 1-epoch cache.
    backward = EpochShuffle(37, seed=11, cached_epochs=1)
    assert [backward.dataset_index(p) for p in reversed(positions)] == expected[::-1]
    assert [EpochShuffle(37, seed=12).dataset_index(p) for p in positions] != expected


def test_take_in_any_chunk_sizes_gives_the_same_positions():
    skips = SkipSchedule([SkipRange(5, 9), SkipRange(20, 21)])
    whole, end = skips.take(0, 30)
    chunks, cursor = [], 0
    for size in (1, 4, 2, 7, 16):
        taken, cursor = skips.take(cursor, size)
        chunks += taken
    assert chunks == whole and cursor == end == whole[-1] + 1
    assert len(whole) == 30 and len(set(whole)) == 30


def test_skipped_positions_are_never_returned():
    ranges = [SkipRange(3, 6), SkipRange(5, 10), (40, 41), SkipRange(12, 12)]
    skips = SkipSchedule(ranges)
    taken, cursor = skips.take(0, 50)
    skipped = set(range(3, 10)) | {40}
    assert not skipped & set(taken)
    assert taken == [p for p in range(cursor) if p not in skipped]
    assert skips.ranges == ((3, 10), (40, 41))
    # A cursor inside a range starts after it.
    assert skips.take(4, 2) == ([10, 11], 12)


def test_take_nothing_keeps_the_cursor():
    assert SkipSchedule([(0, 5)]).take(3, 0) == ([], 3)


@pytest.mark.parametrize("bad", [[(5, 2)], [SkipRange(-1, 3)]])
def test_malformed_skip_range_is_one_clear_line(bad):
    with pytest.raises(DataError, match=r"skip range \[-?\d+, \d+\) is invalid.*skip_ranges"):
        merge_skip_ranges(bad)


def test_permutation_is_read_only_so_callers_cannot_corrupt_the_order():
    order = EpochShuffle(10, seed=1)
    with pytest.raises(ValueError):
        order.permutation(0)[0] = 3
    assert isinstance(order.permutation(0), np.ndarray)
