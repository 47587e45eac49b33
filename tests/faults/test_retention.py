"""A driver killed inside a checkpoint write costs no more than the steps since
the newest checkpoint it recorded (issue 9, item 1). Only the driver deletes
checkpoints, once its logbook recorded a newer one; ranks whose driver is gone
write and commit nothing more. On real processes: a `runmgr launch`
subprocess, its local Ray, kill -9 of the driver while rank 0 holds inside the
write of checkpoint 20 (chaos pause_in_checkpoint), then the same command
again."""

from __future__ import annotations

import pytest

from runmgr.chaos.build import release_file
from runmgr.chaos.state import ChaosState
from tests.e2e.harness import LaunchedRun, kept_losses, pid_gone, runmgr_json_lines
from trainer.manifest import list_checkpoints, step_of, verify_checkpoint

pytestmark = pytest.mark.slow

LEASE_S = 4.0
HOLD_LABEL = "0:pause_in_checkpoint@20"
# keep_last=1: the driverless ranks of the old code deleted step 10 as soon as they committed 20.
EXTRA = ["checkpoint.keep_last=1", f"controller.worker_lease_s={LEASE_S}",
         "chaos.faults=[{kind: pause_in_checkpoint, at_step: 20}]"]


def committed_steps(run: LaunchedRun) -> list[int]:
    """Steps of the checkpoints that verify (manifest written last, files intact)."""
    return [step_of(path) for path in list_checkpoints(run.run_dir / "checkpoints") if verify_checkpoint(path)[0]]


def recorded_checkpoints(run: LaunchedRun) -> list[int]:
    return [e["step"] for e in runmgr_json_lines("logbook", "events", str(run.run_dir), "--json")
            if e["type"] == "checkpoint"]


def test_a_driver_killed_inside_a_checkpoint_write_loses_only_the_steps_since_its_newest_recorded_checkpoint(
        tmp_path, shared_ray):
    run = LaunchedRun(tmp_path / "killed-in-write", extra=EXTRA).start()
    status = run.wait_for(lambda s: s["state"] == "running" and 0 in s.get("paused_ranks", [])
                          and ChaosState(run.run_dir).has_fired(HOLD_LABEL),
                          what="rank 0 holding inside the write of checkpoint 20")
    # Inside the write: 20's files are there, its manifest is not; 10 is the newest the driver recorded.
    assert (run.run_dir / "checkpoints" / "step_00000020").is_dir() and committed_steps(run) == [10]
    assert recorded_checkpoints(run) == [10]
    recorded_step = max(kept_losses(run.run_dir))
    assert recorded_step > 20

    run.kill_driver()
    release_file(run.run_dir, HOLD_LABEL).touch()  # a driverless rank 0 would now commit 20 and train on
    assert all(pid_gone(w["pid"], timeout=LEASE_S + 10) for w in status["workers"]), "workers outlived the driver"
    assert committed_steps(run) == [10], "ranks without a driver committed or deleted a checkpoint"

    # The same command again; it kills nothing, so it runs on the shared Ray.
    resumed = LaunchedRun(run.run_dir, extra=[*EXTRA, f"cluster.address={shared_ray.address}"]).start()
    assert resumed.wait() == 0, resumed.output()[-3000:]
    events = runmgr_json_lines("logbook", "events", str(run.run_dir), "--json")
    ends = {e["subrun"]: e for e in events if e["type"] == "subrun_end"}
    assert ends["1.00"]["end_state"] == "abandoned" and ends["1.01"]["end_state"] == "finished"
    start = next(e for e in events if e["type"] == "subrun_start" and e["subrun"] == "1.01")
    assert start["start_step"] == 10 and start["start_checkpoint"].endswith("step_00000010")
    assert start["evidence"]["steps_lost"] == recorded_step - 10
    assert sorted(kept_losses(run.run_dir)) == list(range(1, 41))
    # The driver kept what checkpoint.keep_last asks for, deleting only after recording a newer one.
    assert committed_steps(run) == [40] and [p.name for p in list_checkpoints(run.run_dir / "checkpoints")] == [
        "step_00000040"]
