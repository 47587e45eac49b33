"""Fixtures shared by the runmgr tests: scripted Ascend tools (the health
check, the watcher's device readings, the mid-run poll) and one local Ray
shared by the tests that need Ray in this process."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.runmgr.healthcheck.fake_ascend import FakeAscend


@pytest.fixture
def ascend(tmp_path: Path) -> FakeAscend:
    return FakeAscend(tmp_path / "ascend-bin")


@pytest.fixture(scope="session")
def local_ray():
    """A local Ray for this test process (reused if one is already up)."""
    import ray

    started = not ray.is_initialized()
    if started:
        # address="local": never join another cluster that happens to run on this machine.
        ray.init(address="local", num_cpus=2, include_dashboard=False,
                 logging_level=logging.ERROR, log_to_driver=False)
    yield ray
    if started:
        ray.shutdown()
