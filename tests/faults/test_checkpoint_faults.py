"""A killed rank, a killed driver and checkpoints that fail differently than
expected, on one real lineage and its relaunches. Each fault lands at an exact
step: the ranks pause there (chaos pause_at_step) and the test acts on the
paused run, so what was checkpointed and recorded at that moment is known, on
any machine.

The lineage: rank 1 is killed with SIGKILL while the ranks wait after step 25;
sub-run 1.01 resumes from checkpoint 20; its driver is killed with SIGKILL
while its ranks wait after step 35 (checkpoints 10, 20 and 30 verified, saved
synchronously so that 30 is written before the ranks wait). It has a local Ray
of its own: its kill -9 is also the orphans' case, no process of that Ray
(GCS, raylet, Ray's agents, the ranks, the node agent) is alive 15 s later;
the reaper started with that Ray ends them. The head's death is the other
case: tests/faults/test_head_death.py.

Two relaunches of copies of its run directory share that stop. In one,
checkpoint 30's ``.metadata`` is crafted and a shard of 20 is unreadable, so
that the driver rejects each with its own reason and the fresh driver
continues the lineage from 10. In the other, 30 holds 20's data under its own
manifest, which only the trainer can tell, and 20's largest shard is cut in
half, which the driver tells from its manifest: after the trainer's refusal of
30 the next sub-run rejects both and starts from 10. The relaunches neither
kill nor reconfigure their cluster: they run on the session's shared Ray. Both
end with the kept losses of an uninterrupted run, bit for bit, through the
killed rank's restart and the killed driver's relaunch."""

from __future__ import annotations

import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.harness import LaunchedRun, kept_losses, pauses_after, pid_gone, runmgr_json_lines, runmgr_text
from tests.faults.checkpoint_damage import craft_metadata, reader_prefix, rewrite_manifest
from tests.faults.ray_processes import Process, descendants, survivors_at
from trainer.manifest import DCP_METADATA_NAME, MANIFEST_NAME

pytestmark = pytest.mark.slow

# keep_last=10: the older checkpoints must be there to fall back to. Synchronous saves:
# checkpoint 30 is written before the ranks wait after step 35 (the losses are the same).
KEEP_ALL = ["checkpoint.keep_last=10", "checkpoint.async_save=false"]
KILL_WORKER_AT, STOPPED_AT = 25, 35
"""The pauses: the killed rank's moment (sub-run 1.00, index 0), the killed driver's (1.01, index 1)."""
NEWEST, MIDDLE, OLDEST = "step_00000030", "step_00000020", "step_00000010"
NO_ORPHAN_AFTER_S = 15


@dataclass
class Killed:
    """The stopped lineage: the killed rank as status.json named it, the processes of its own Ray
    just before its driver's kill -9, and those alive 15 s later."""

    victim: dict
    ray_processes: dict[Process, str]
    worker_pids: set[int]
    survivors: dict[Process, str]


def kill_rank_1(run: LaunchedRun) -> dict:
    """SIGKILL rank 1 while the ranks wait after :data:`KILL_WORKER_AT` (checkpoint 20 verified);
    the victim as status.json named it."""
    status = run.wait_paused(KILL_WORKER_AT)
    victim = next(w for w in status["workers"] if w["rank"] == 1)
    os.kill(victim["pid"], signal.SIGKILL)
    return victim


@pytest.fixture(scope="module")
def killed(tmp_path_factory) -> tuple[Path, Killed]:
    """A lineage whose rank 1 was killed after step 25 and whose driver was killed while the
    restarted sub-run's ranks waited after step 35; its Ray's processes."""
    extra = [*KEEP_ALL, pauses_after(KILL_WORKER_AT, STOPPED_AT)]
    run = LaunchedRun(tmp_path_factory.mktemp("ckfaults") / "stopped", extra=extra).start()
    victim = kill_rank_1(run)
    status = run.wait_paused(STOPPED_AT, index=1)
    assert status["subrun"] == "1.01", status
    ray_processes = descendants(run.proc.pid)
    run.kill_driver()
    survivors = survivors_at(ray_processes, time.time() + NO_ORPHAN_AFTER_S)
    assert all(pid_gone(w["pid"]) for w in status["workers"]), "workers outlived their driver"
    run.release(STOPPED_AT, index=1)  # a relaunch must not wait there again (the lineage also remembers)
    assert max(kept_losses(run.run_dir)) == STOPPED_AT  # the driver recorded step 35
    checkpoints = run.run_dir / "checkpoints"
    assert [p.name for p in sorted(checkpoints.glob("step_*")) if (p / MANIFEST_NAME).is_file()] == [
        OLDEST, MIDDLE, NEWEST]
    return run.run_dir, Killed(victim, ray_processes, {w["pid"] for w in status["workers"]}, survivors)


@pytest.fixture(scope="module")
def stopped_run(killed) -> Path:
    """The stopped run's directory (each relaunch damages a copy of it)."""
    return killed[0]


def test_no_process_of_the_runs_ray_outlives_a_killed_driver_by_15_s(killed):
    found = killed[1]
    names = set(found.ray_processes.values())
    # what used to outlive the driver by 60-120 s: Ray's agents and the run's own actors (then the
    # device poller; a run of CPU ranks has none now, its node agent is the run's actor there)
    assert {"gcs_server", "raylet", "ray::DashboardAgent", "ray::RuntimeEnvAgent", "ray::NodeAgent"} <= names
    assert found.worker_pids <= {pid for pid, _ in found.ray_processes}
    assert found.survivors == {}


def copy_of(stopped: Path, tmp_path: Path, name: str) -> Path:
    target = tmp_path / name
    shutil.copytree(stopped, target, symlinks=True)
    return target


def relaunch(run_dir: Path, shared_ray, prefix: list[str] | None = None) -> list[dict]:
    """The same `runmgr launch` again over ``run_dir`` (on the shared Ray), to the end; the logbook's events."""
    run = LaunchedRun(run_dir, extra=[*KEEP_ALL, pauses_after(KILL_WORKER_AT, STOPPED_AT),
                                      f"cluster.address={shared_ray.address}"])
    run.args = [*(prefix or []), *run.args]
    assert run.start().wait() == 0, run.output()[-3000:]
    return runmgr_json_lines("logbook", "events", str(run_dir), "--json")


def rejections(events: list[dict], subrun: str) -> dict[str, str]:
    """``{checkpoint name: reason}`` of the checkpoints ``subrun`` passed over."""
    return {Path(path).name: reason for path, reason in start_of(events, subrun)["evidence"]["rejected_checkpoints"]}


def start_of(events: list[dict], subrun: str) -> dict:
    return next(e for e in events if e["type"] == "subrun_start" and e["subrun"] == subrun)


def ends(events: list[dict]) -> dict[str, str]:
    return {e["subrun"]: e["end_state"] for e in events if e["type"] == "subrun_end"}


@pytest.fixture(scope="module")
def rejected_by_the_driver(stopped_run, tmp_path_factory, shared_ray) -> dict:
    """A relaunch over a copy whose checkpoint 30 has a crafted ``.metadata`` and whose 20 has an
    unreadable shard: its events, run directory, the shard and the marker the pickle would create."""
    tmp = tmp_path_factory.mktemp("driver-rejects")
    run_dir = copy_of(stopped_run, tmp, "crafted-and-unreadable")
    marker = tmp / "code-ran"
    craft_metadata(run_dir / "checkpoints" / NEWEST, marker)  # the manifest vouches for it
    shard = largest_shard(run_dir / "checkpoints" / MIDDLE)
    shard.chmod(0)
    events = relaunch(run_dir, shared_ray, reader_prefix())  # as root: without the capabilities that read it anyway
    return {"events": events, "run_dir": run_dir, "shard": shard, "marker": marker}


def largest_shard(checkpoint: Path) -> Path:
    return max(checkpoint.glob("*.distcp"), key=lambda p: p.stat().st_size)


def test_a_killed_worker_is_named_and_its_restart_resumes_from_the_last_verified_checkpoint(killed,
                                                                                          rejected_by_the_driver):
    victim = killed[1].victim
    events, run_dir = rejected_by_the_driver["events"], rejected_by_the_driver["run_dir"]
    incident = next(e for e in events if e["type"] == "incident")
    assert incident["subrun"] == "1.00" and "rank 1" in incident["summary"]
    assert str(victim["pid"]) in incident["summary"]
    assert ends(events)["1.00"] == "restarting"
    restart = start_of(events, "1.01")
    assert restart["start_step"] == 20 and restart["start_checkpoint"].endswith(MIDDLE)
    assert restart["evidence"]["steps_lost"] == KILL_WORKER_AT - 20
    timeline = runmgr_text("logbook", "show", str(run_dir))
    assert "1.01" in timeline and "worker_death" in timeline and "killed" in timeline and "finished" in timeline
    # its bit-for-bit losses, through the restart and the relaunch:
    # test_an_unreadable_shard_is_rejected_and_an_older_checkpoint_used (the same lineage)


def test_an_unreadable_shard_is_rejected_and_an_older_checkpoint_used(rejected_by_the_driver, reference_losses):
    events, run_dir, shard = (rejected_by_the_driver[k] for k in ("events", "run_dir", "shard"))
    assert f"file {shard.name} cannot be read (Permission denied)" in rejections(events, "1.02")[MIDDLE]
    assert start_of(events, "1.02")["start_checkpoint"].endswith(OLDEST)
    assert ends(events) == {"1.00": "restarting", "1.01": "abandoned", "1.02": "finished"}
    assert kept_losses(run_dir) == reference_losses  # exact float equality, every step
    timeline = " ".join(runmgr_text("logbook", "show", str(run_dir)).split())  # as read, not as wrapped
    assert f"rejected {MIDDLE}: {MIDDLE}: file {shard.name} cannot be read" in timeline


def test_a_relaunch_after_a_killed_driver_says_what_it_continues(rejected_by_the_driver):
    events, run_dir = rejected_by_the_driver["events"], rejected_by_the_driver["run_dir"]
    assert start_of(events, "1.02")["start_step"] == 10
    # As a RayJob's retry would: a fresh driver on the same run directory says what it continues.
    (restarted,) = [e for e in events if e["type"] == "event" and e["kind"] == "driver_restarted"]
    assert restarted["subrun"] == "1.02" and restarted["data"] == {"previous_subrun": "1.01", "resumed_step": 10,
                                                                   "steps_lost": STOPPED_AT - 10}
    timeline = runmgr_text("logbook", "show", str(run_dir))
    assert "rejected" in timeline and "relaunch (driver restarted" in timeline


def test_a_crafted_metadata_is_refused_runs_no_code_and_an_older_checkpoint_is_used(rejected_by_the_driver):
    events = rejected_by_the_driver["events"]
    assert not rejected_by_the_driver["marker"].exists()
    reason = rejections(events, "1.02")[NEWEST]
    assert "is not plain DCP metadata: it asks for io.open" in reason and "not code to run" in reason
    # each damaged checkpoint rejected once, with its own reason, newest first; 10 is used
    assert list(rejections(events, "1.02")) == [NEWEST, MIDDLE]
    assert start_of(events, "1.02")["start_checkpoint"].endswith(OLDEST)
    assert ends(events) == {"1.00": "restarting", "1.01": "abandoned", "1.02": "finished"}
    # its bit-for-bit losses: test_an_unreadable_shard_is_rejected_and_an_older_checkpoint_used (the same run)


def test_a_checkpoint_whose_data_disagree_with_its_manifest_is_rejected_once_and_a_truncated_one_too(
        stopped_run, tmp_path, shared_ray, reference_losses):
    run_dir = copy_of(stopped_run, tmp_path, "inconsistent-and-truncated")
    damaged, previous = run_dir / "checkpoints" / NEWEST, run_dir / "checkpoints" / MIDDLE
    for data in [*damaged.glob("*.distcp"), damaged / DCP_METADATA_NAME]:
        data.unlink()
    for data in [*previous.glob("*.distcp"), previous / DCP_METADATA_NAME]:
        shutil.copy2(data, damaged / data.name)  # step 20's data under step 30's manifest ...
    rewrite_manifest(damaged)  # ... whose sizes and hashes now match: only the trainer can tell
    cut = largest_shard(previous)
    with open(cut, "r+b") as f:  # and step 20's own largest shard cut in half: its manifest tells
        f.truncate(cut.stat().st_size // 2)

    events = relaunch(run_dir, shared_ray)

    # 1.02 starts from step 30, its trainer refuses it; one rejection, no restart storm.
    assert ends(events) == {"1.00": "restarting", "1.01": "abandoned", "1.02": "restarting", "1.03": "finished"}
    assert start_of(events, "1.02")["start_checkpoint"].endswith(NEWEST)
    incident = start_of(events, "1.03")["evidence"]["incident"]
    assert incident["evidence"]["category"] == "checkpoint"
    assert Path(incident["evidence"]["checkpoint"]) == damaged.resolve()
    assert "its data hold step 20, its manifest says 30" in incident["description"]
    assert NEWEST in rejections(events, "1.03")
    # The truncated checkpoint is rejected and the previous verified one used.
    rejected = [e for e in events if e["type"] == "event" and e["kind"] == "checkpoint_rejected"
                and e["subrun"] == "1.03"]
    truncated = [e for e in rejected if MIDDLE in e["message"]]
    assert truncated and "truncated" in truncated[0]["message"], [e["message"] for e in rejected]
    assert start_of(events, "1.03")["start_checkpoint"].endswith(OLDEST)
    assert kept_losses(run_dir) == reference_losses
    timeline = " ".join(runmgr_text("logbook", "show", str(run_dir)).split())  # as read, not as wrapped
    assert f"reject checkpoint checkpoints/{NEWEST}" in timeline and f"rejected {NEWEST}" in timeline
