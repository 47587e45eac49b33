"""Fixtures shared by the runmgr tests: scripted Ascend tools (the health
check, the watcher's device readings, the mid-run poll) and one local Ray
shared by the tests that need Ray in this process."""

from __future__ import annotations

from pathlib import Path

import pytest

from runmgr.cluster import DRIVER_INIT_KWARGS, LocalCluster, shutdown_ray, start_local
from runmgr.config.schema import ClusterConfig

from tests.runmgr.healthcheck.fake_ascend import FakeAscend


@pytest.fixture
def ascend(tmp_path: Path) -> FakeAscend:
    return FakeAscend(tmp_path / "ascend-bin")


@pytest.fixture(scope="session")
def local_ray():
    """A local Ray for this test process (reused if one is already up): one node of 2 CPUs of this
    process's own, started as a run's own one-node Ray is (runmgr.cluster.LocalCluster: its workers
    at nice 0, as a launch has them; no autoscaler monitor and no log monitor, which
    ``ray.init(address="local")`` cannot leave out: about 1.1 CPU-seconds a start, and nothing
    here scales a cluster or reads its workers' output)."""
    import ray

    if ray.is_initialized():
        yield ray
        return
    # Never joins another cluster that happens to run on this machine; retried as a launch
    # retries its own Ray (on a loaded machine a raylet may miss Ray's 30 s).
    local = start_local(lambda: LocalCluster(ClusterConfig(local_nodes=1), head_cpus=2))
    try:
        ray.init(address=local.address, **DRIVER_INIT_KWARGS)
        yield ray
    finally:
        shutdown_ray(local.reaper.reap)  # bounded: Ray's shutdown once waited for ever here
        local.shutdown()
