"""The reference every layout is compared with: plain data parallel on 4 ranks."""

import math

import pytest

from tests.trainer.parallel.conftest import PARALLEL_STEPS

pytestmark = pytest.mark.slow  # 4 ranks training: run first under xdist


def test_data_parallel_reference_trains_and_every_rank_agrees(data_parallel_run):
    results = data_parallel_run["results"]
    losses = results[0]["losses"]
    assert len(losses) == PARALLEL_STEPS and all(math.isfinite(x) for x in losses)
    assert all(result["losses"] == losses for result in results)  # one float, gathered in a fixed order
    assert losses[-1] < losses[0] - 1.0  # it learns: byte-level loss falls from ~5.5
