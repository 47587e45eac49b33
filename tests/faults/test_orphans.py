"""No orphans, on real processes: after ``kill -9`` of the driver, no process
of the run's own local Ray (GCS, raylet, Ray's agents, the ranks, the device
poller) is alive 15 s later; the reaper started with that Ray ends them. The
head's death is the other case: tests/faults/test_head_death.py."""

from __future__ import annotations

import time

import pytest

from tests.e2e.harness import LaunchedRun, pause_after
from tests.faults.ray_processes import descendants, survivors_at

pytestmark = pytest.mark.slow

PAUSE_STEP = 15
NO_ORPHAN_AFTER_S = 15


def test_no_process_of_the_runs_ray_outlives_a_killed_driver_by_15_s(tmp_path):
    run = LaunchedRun(tmp_path / "run", extra=[pause_after(PAUSE_STEP)]).start()
    status = run.wait_paused(PAUSE_STEP)
    ray_processes = descendants(run.proc.pid)
    names = set(ray_processes.values())
    # what used to outlive the driver by 60-120 s: Ray's agents and the device poller
    assert {"gcs_server", "raylet", "ray::DashboardAgent", "ray::RuntimeEnvAgent", "ray::DevicePoller"} <= names
    assert {w["pid"] for w in status["workers"]} <= {pid for pid, _ in ray_processes}

    run.kill_driver()
    killed_at = time.time()

    assert survivors_at(ray_processes, killed_at + NO_ORPHAN_AFTER_S) == {}
