"""The foundation's promises, end to end on real processes: a worker killed with
SIGKILL, then the driver killed with SIGKILL and the newest checkpoint damaged, each
followed by a resume whose per-step losses are bit-for-bit those of an uninterrupted
run. Each fault lands at an exact step: the ranks pause there (chaos pause_at_step)
and the test acts on the paused run, so what was checkpointed and recorded at that
moment is known, on any machine.

One lineage meets both faults (one launch and its relaunch, not three launches): the
killed worker's restart is sub-run 1.01, the killed driver's relaunch 1.02. The run has
a local Ray of its own: killing the driver takes its Ray and its ranks with it."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.e2e.harness import LaunchedRun, kept_losses, pauses_after, pid_gone, runmgr_json_lines, runmgr_text
from trainer.manifest import MANIFEST_NAME

pytestmark = pytest.mark.slow

KEEP_ALL = ["checkpoint.keep_last=10"]
"""So that the checkpoint before a damaged one is there to fall back to."""
KILL_WORKER_AT, KILL_DRIVER_AT = 20, 30
"""The pauses: the first is the killed worker's moment (sub-run 1.00), the second the killed driver's (1.01)."""


def verified_steps(run_dir: Path) -> list[int]:
    """Steps of the checkpoints whose manifest is written (the trainer writes it last)."""
    return sorted(int(p.name[5:]) for p in (run_dir / "checkpoints").glob("step_*") if (p / MANIFEST_NAME).is_file())


def kill_rank_1(run: LaunchedRun) -> dict:
    """SIGKILL rank 1 while the ranks wait after :data:`KILL_WORKER_AT`; the victim as status.json named it.
    Checkpoint 10 is verified then (saving 20 waited for it) and 20 is still in flight (its manifest
    is written at the next step, which never comes)."""
    status = run.wait_paused(KILL_WORKER_AT)
    victim = next(w for w in status["workers"] if w["rank"] == 1)
    os.kill(victim["pid"], signal.SIGKILL)
    return victim


def kill_driver(run: LaunchedRun) -> None:
    """SIGKILL the driver while the restarted sub-run's ranks wait after :data:`KILL_DRIVER_AT`; its
    ranks must not outlive it."""
    status = run.wait_paused(KILL_DRIVER_AT, index=1)
    assert status["subrun"] == "1.01", status
    worker_pids = [w["pid"] for w in status["workers"]]
    run.kill_driver()
    assert all(pid_gone(pid) for pid in worker_pids), "workers outlived their driver"
    run.release(KILL_DRIVER_AT, index=1)  # the relaunch must not wait there again (the lineage also remembers)


def truncate_newest_checkpoint(run_dir: Path) -> Path:
    """Cut the largest shard of the newest verified checkpoint in half; that checkpoint."""
    newest = run_dir / "checkpoints" / f"step_{max(verified_steps(run_dir)):08d}"
    data_file = max((p for p in newest.iterdir() if p.suffix == ".distcp"), key=lambda p: p.stat().st_size)
    with open(data_file, "r+b") as f:
        f.truncate(data_file.stat().st_size // 2)
    return newest


def test_a_killed_worker_then_a_killed_driver_resume_bit_for_bit_past_a_damaged_checkpoint(tmp_path, reference_losses):
    extra = [*KEEP_ALL, pauses_after(KILL_WORKER_AT, KILL_DRIVER_AT)]
    run = LaunchedRun(tmp_path / "recovery", extra=extra).start()
    victim = kill_rank_1(run)
    kill_driver(run)

    # The driver recorded step 30; checkpoints 10 and 20 (20 saved again by 1.01) verify, 30 was in flight.
    assert max(kept_losses(run.run_dir)) == KILL_DRIVER_AT
    assert verified_steps(run.run_dir) == [10, 20]
    newest = truncate_newest_checkpoint(run.run_dir)

    resumed = LaunchedRun(run.run_dir, extra=extra).start()  # the same command again
    assert resumed.wait() == 0, resumed.output()[-3000:]

    assert kept_losses(run.run_dir) == reference_losses  # exact float equality, every step
    events = runmgr_json_lines("logbook", "events", str(run.run_dir), "--json")
    starts = {e["subrun"]: e for e in events if e["type"] == "subrun_start"}
    ends = {e["subrun"]: e for e in events if e["type"] == "subrun_end"}
    assert [ends[s]["end_state"] for s in ("1.00", "1.01", "1.02")] == ["restarting", "abandoned", "finished"]

    # The killed worker: its incident names it, and the restart resumed from the last verified checkpoint.
    incident = next(e for e in events if e["type"] == "incident")
    assert "rank 1" in incident["summary"] and str(victim["pid"]) in incident["summary"]
    assert starts["1.01"]["start_step"] == 10 and starts["1.01"]["start_checkpoint"].endswith("step_00000010")
    assert starts["1.01"]["evidence"]["steps_lost"] == 10

    # The killed driver: the truncated checkpoint is rejected and the previous verified one used.
    rejected = [e for e in events if e["type"] == "event" and e["kind"] == "checkpoint_rejected"
                and e["subrun"] == "1.02"]  # 1.01 rejected step 20's first save, in flight at the kill
    truncated = [e for e in rejected if newest.name in e["message"]]
    assert truncated and "truncated" in truncated[0]["message"], [e["message"] for e in rejected]
    assert starts["1.02"]["start_step"] == 10
    # As a RayJob's retry would: a fresh driver on the same run directory says what it continues.
    (restarted,) = [e for e in events if e["type"] == "event" and e["kind"] == "driver_restarted"]
    assert restarted["subrun"] == "1.02" and restarted["data"] == {"previous_subrun": "1.01", "resumed_step": 10,
                                                                   "steps_lost": 20}
    timeline = runmgr_text("logbook", "show", str(run.run_dir))
    assert "1.01" in timeline and "worker_death" in timeline and "killed" in timeline and "finished" in timeline
    assert "rejected" in timeline and "relaunch (driver restarted" in timeline
