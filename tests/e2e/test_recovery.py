"""The foundation's promises, end to end on real processes: a worker killed
with SIGKILL, the driver killed with SIGKILL, and a damaged checkpoint, each
followed by a resume whose per-step losses are bit-for-bit those of an
uninterrupted run."""

from __future__ import annotations

import os
import signal

import pytest

from tests.e2e.harness import LaunchedRun, kept_losses, pid_gone, runmgr_json_lines, runmgr_text

pytestmark = pytest.mark.slow


def test_a_killed_worker_resumes_from_the_last_checkpoint_bit_for_bit(tmp_path, reference_losses):
    run = LaunchedRun(tmp_path / "killworker").start()
    status = run.wait_for(lambda s: s["state"] == "running" and s["step"] >= 14, what="step 14")
    victim = next(w for w in status["workers"] if w["rank"] == 1)
    os.kill(victim["pid"], signal.SIGKILL)
    assert run.wait() == 0, run.output()[-3000:]

    assert kept_losses(run.run_dir) == reference_losses  # exact float equality, every step
    events = runmgr_json_lines("logbook", "events", str(run.run_dir), "--json")
    incident = next(e for e in events if e["type"] == "incident")
    assert "rank 1" in incident["summary"] and str(victim["pid"]) in incident["summary"]
    start = next(e for e in events if e["type"] == "subrun_start" and e["subrun"] == "1.01")
    assert start["start_step"] in (10, 20) and start["start_checkpoint"].endswith(f"step_{start['start_step']:08d}")
    assert start["evidence"]["steps_lost"] >= 0
    timeline = runmgr_text("logbook", "show", str(run.run_dir))
    assert "1.01" in timeline and "worker_death" in timeline and "killed" in timeline and "finished" in timeline


def test_a_killed_driver_resumes_as_the_next_subrun_past_a_damaged_checkpoint(tmp_path, reference_losses):
    keep_all = ["checkpoint.keep_last=10"]  # so that the previous checkpoint is there to fall back to
    run = LaunchedRun(tmp_path / "killdriver", extra=keep_all).start()
    status = run.wait_for(lambda s: s["state"] == "running" and s["step"] >= 25, what="step 25")
    worker_pids = [w["pid"] for w in status["workers"]]
    run.kill_driver()
    assert all(pid_gone(pid) for pid in worker_pids), "workers outlived their driver"

    # The newest checkpoint a resume could use: at or before the last step the
    # logbook recorded (later ones, written by the workers in the seconds before
    # they noticed their driver was gone, are passed over for that reason).
    recorded = max(kept_losses(run.run_dir))
    checkpoints = sorted(p for p in (run.run_dir / "checkpoints").glob("step_*") if int(p.name[5:]) <= recorded)
    newest = checkpoints[-1]
    data_file = max((p for p in newest.iterdir() if p.suffix == ".distcp"), key=lambda p: p.stat().st_size)
    with open(data_file, "r+b") as f:  # truncate the newest checkpoint's largest shard
        f.truncate(data_file.stat().st_size // 2)

    resumed = LaunchedRun(run.run_dir, extra=keep_all).start()
    assert resumed.wait() == 0, resumed.output()[-3000:]

    assert kept_losses(run.run_dir) == reference_losses
    events = runmgr_json_lines("logbook", "events", str(run.run_dir), "--json")
    ends = {e["subrun"]: e for e in events if e["type"] == "subrun_end"}
    assert ends["1.00"]["end_state"] == "abandoned" and ends["1.01"]["end_state"] == "finished"
    rejected = [e for e in events if e["type"] == "event" and e["kind"] == "checkpoint_rejected"]
    truncated = [e for e in rejected if newest.name in e["message"]]
    assert truncated and "truncated" in truncated[0]["message"], [e["message"] for e in rejected]
    start = next(e for e in events if e["type"] == "subrun_start" and e["subrun"] == "1.01")
    assert start["start_step"] == int(checkpoints[-2].name[5:])  # the previous checkpoint was used
    timeline = runmgr_text("logbook", "show", str(run.run_dir))
    assert "rejected" in timeline and "relaunch" in timeline
