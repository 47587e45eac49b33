"""Fixtures shared by the runmgr tests: scripted Ascend tools (the health
check, the watcher's device readings, the mid-run poll) and one local Ray
shared by the tests that need Ray in this process."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from runmgr.cluster import LOCAL_RAY_SYSTEM_CONFIG

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
        # The run's own system config: its workers at nice 0, as a launch has them.
        ray.init(address="local", num_cpus=2, include_dashboard=False,
                 logging_level=logging.ERROR, log_to_driver=False,
                 _system_config=LOCAL_RAY_SYSTEM_CONFIG)
    yield ray
    if started:
        ray.shutdown()
