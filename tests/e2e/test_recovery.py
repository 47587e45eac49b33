"""The foundation's promises, end to end on real processes: a worker killed
with SIGKILL, the driver killed with SIGKILL, and a damaged checkpoint, each
followed by a resume whose per-step losses are bit-for-bit those of an
uninterrupted run. Each fault lands at an exact step: the ranks pause there
(chaos pause_at_step) and the test acts on the paused run, so what was
checkpointed and recorded at that moment is known, on any machine."""

from __future__ import annotations

import os
import signal

import pytest

from tests.e2e.harness import LaunchedRun, kept_losses, pause_after, pid_gone, runmgr_json_lines, runmgr_text
from trainer.manifest import MANIFEST_NAME

pytestmark = pytest.mark.slow


def verified_steps(run_dir) -> list[int]:
    """Steps of the checkpoints whose manifest is written (the trainer writes it last)."""
    return sorted(int(p.name[5:]) for p in (run_dir / "checkpoints").glob("step_*") if (p / MANIFEST_NAME).is_file())


def test_a_killed_worker_resumes_from_the_last_checkpoint_bit_for_bit(tmp_path, reference_losses, shared_ray):
    # Paused after step 20: checkpoint 10 is verified (saving 20 waited for it) and 20 is
    # still in flight (its manifest is written at the next step, which never comes). A rank
    # is killed, not the cluster: the session's Ray does (tests/conftest.py).
    run = LaunchedRun(tmp_path / "killworker", extra=[f"cluster.address={shared_ray.address}", pause_after(20)]).start()
    status = run.wait_paused(20)
    victim = next(w for w in status["workers"] if w["rank"] == 1)
    os.kill(victim["pid"], signal.SIGKILL)
    assert run.wait() == 0, run.output()[-3000:]

    assert kept_losses(run.run_dir) == reference_losses  # exact float equality, every step
    events = runmgr_json_lines("logbook", "events", str(run.run_dir), "--json")
    incident = next(e for e in events if e["type"] == "incident")
    assert "rank 1" in incident["summary"] and str(victim["pid"]) in incident["summary"]
    start = next(e for e in events if e["type"] == "subrun_start" and e["subrun"] == "1.01")
    assert start["start_step"] == 10 and start["start_checkpoint"].endswith("step_00000010")
    assert start["evidence"]["steps_lost"] == 10
    timeline = runmgr_text("logbook", "show", str(run.run_dir))
    assert "1.01" in timeline and "worker_death" in timeline and "killed" in timeline and "finished" in timeline


def test_a_killed_driver_resumes_as_the_next_subrun_past_a_damaged_checkpoint(tmp_path, reference_losses):
    keep_all = ["checkpoint.keep_last=10"]  # so that the previous checkpoint is there to fall back to
    extra = [*keep_all, pause_after(30)]
    run = LaunchedRun(tmp_path / "killdriver", extra=extra).start()
    status = run.wait_paused(30)
    worker_pids = [w["pid"] for w in status["workers"]]
    run.kill_driver()
    assert all(pid_gone(pid) for pid in worker_pids), "workers outlived their driver"
    run.release(30)  # the relaunch must not wait there again (the lineage also remembers the pause)

    # The driver recorded step 30; checkpoints 10 and 20 verify, 30 was still in flight.
    assert max(kept_losses(run.run_dir)) == 30
    assert verified_steps(run.run_dir) == [10, 20]
    newest = run.run_dir / "checkpoints" / "step_00000020"
    data_file = max((p for p in newest.iterdir() if p.suffix == ".distcp"), key=lambda p: p.stat().st_size)
    with open(data_file, "r+b") as f:  # truncate the newest verified checkpoint's largest shard
        f.truncate(data_file.stat().st_size // 2)

    resumed = LaunchedRun(run.run_dir, extra=extra).start()  # the same command again
    assert resumed.wait() == 0, resumed.output()[-3000:]

    assert kept_losses(run.run_dir) == reference_losses
    events = runmgr_json_lines("logbook", "events", str(run.run_dir), "--json")
    ends = {e["subrun"]: e for e in events if e["type"] == "subrun_end"}
    assert ends["1.00"]["end_state"] == "abandoned" and ends["1.01"]["end_state"] == "finished"
    rejected = [e for e in events if e["type"] == "event" and e["kind"] == "checkpoint_rejected"]
    truncated = [e for e in rejected if newest.name in e["message"]]
    assert truncated and "truncated" in truncated[0]["message"], [e["message"] for e in rejected]
    start = next(e for e in events if e["type"] == "subrun_start" and e["subrun"] == "1.01")
    assert start["start_step"] == 10  # the previous verified checkpoint was used
    # As a RayJob's retry would: a fresh driver on the same run directory says what it continues.
    (restarted,) = [e for e in events if e["type"] == "event" and e["kind"] == "driver_restarted"]
    assert restarted["subrun"] == "1.01" and restarted["data"] == {"previous_subrun": "1.00", "resumed_step": 10,
                                                                   "steps_lost": 20}
    timeline = runmgr_text("logbook", "show", str(run.run_dir))
    assert "rejected" in timeline and "relaunch (driver restarted" in timeline
