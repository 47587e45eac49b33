"""The Ray head's death, on real processes: the run's local GCS is killed with
SIGKILL while the ranks stand paused after step 5. runmgr notices before Ray
would end the driver (60 s, with only its own line): one runmgr line, a
recorded ``failed`` end within the controller's timeout, and no process of
the run's local Ray left 15 s after the head died."""

from __future__ import annotations

import os
import signal
import time

import pytest

from runmgr.config.schema import ControllerConfig
from tests.e2e.harness import LaunchedRun, pause_after, runmgr_json_lines
from tests.faults.ray_processes import child_named, descendants, survivors_at

pytestmark = pytest.mark.slow

PAUSE_STEP = 5  # any step: the ranks only need to be training (and standing still) when the fault comes
NO_ORPHAN_AFTER_S = 15
HEAD_GONE = "the Ray cluster's head is gone"


@pytest.fixture(scope="module")
def head_death(tmp_path_factory) -> dict:
    run = LaunchedRun(tmp_path_factory.mktemp("headdeath") / "run", extra=[pause_after(PAUSE_STEP)]).start()
    run.wait_paused(PAUSE_STEP)
    ray_processes = descendants(run.proc.pid)
    gcs = child_named(run.proc.pid, "gcs_server")
    os.kill(gcs, signal.SIGKILL)
    killed_at = time.time()
    survivors = survivors_at(ray_processes, killed_at + NO_ORPHAN_AFTER_S)
    code = run.wait(timeout=120)
    events = runmgr_json_lines("logbook", "events", str(run.run_dir), "--json")
    return {"code": code, "output": run.output(), "events": events, "killed_at": killed_at, "gcs": gcs,
            "ray_processes": ray_processes, "survivors": survivors}


def test_the_heads_death_is_one_runmgr_line_and_a_failed_end_within_the_controllers_timeout(head_death):
    output = head_death["output"]
    assert head_death["code"] == 1, output[-3000:]
    lines = [line for line in output.splitlines() if HEAD_GONE in line]
    assert len(lines) == 1, output[-3000:]
    assert f"FAILED in sub-run 1.00 at step {PAUSE_STEP}" in lines[0]
    assert f"GCS process (pid {head_death['gcs']}) was killed by signal 9" in lines[0]
    assert "run the same `runmgr launch` again" in lines[0]
    assert "Failed to connect to GCS" not in output and "Traceback" not in output  # Ray did not end the driver
    end = next(e for e in head_death["events"] if e["type"] == "subrun_end")
    assert end["subrun"] == "1.00" and end["end_state"] == "failed" and end["last_step"] == PAUSE_STEP
    assert end["reason"].startswith(HEAD_GONE)
    assert end["time"] - head_death["killed_at"] < ControllerConfig().cluster_lost_timeout_s


def test_no_process_of_the_runs_ray_outlives_the_head_by_15_s(head_death):
    names = set(head_death["ray_processes"].values())
    assert {"raylet", "ray::DashboardAgent", "ray::RuntimeEnvAgent"} <= names, names  # what used to be left behind
    assert head_death["survivors"] == {}
