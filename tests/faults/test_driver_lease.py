"""The driver lease and what a killed driver may leave, on real processes
(issue 9, items 1 and 2), in one lineage. A driver starved of CPU keeps its
workers; a driver killed with kill -9 loses them within the lease. A starved
driver is not a dead one: a worker stops only when its driver's process is
gone (or, for a driver on another machine, when Ray no longer counts its job
alive). And a driver killed inside a checkpoint write costs no more than the
steps since the newest checkpoint it recorded: only the driver deletes
checkpoints, once its logbook recorded a newer one; ranks whose driver is gone
write and commit nothing more.

The run trains with a lease of one second and keeps one checkpoint; from step
5 the driver is held to a tenth of a core (a cgroup quota: a starved driver
that starves nothing else), and gets no CPU at all (SIGSTOP) for three leases;
at step 8, once the same ranks trained on after it, it is given back its CPU;
it is killed with kill -9 while rank 0 holds inside the write of checkpoint 20
(chaos pause_in_checkpoint). Its own local Ray goes with it; the same command
again, which kills nothing, runs on the session's shared Ray."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from runmgr.chaos.build import release_file
from runmgr.chaos.state import ChaosState
from tests.e2e.harness import LaunchedRun, kept_losses, pid_gone, runmgr_json_lines
from tests import throttle
from trainer.manifest import list_checkpoints, step_of, verify_checkpoint

pytestmark = pytest.mark.slow

LEASE_S = 1.0
MARGIN_S = 10.0
STARVED_AT, FED_AT = 5, 8
PAUSES = {STARVED_AT: f"0:pause_at_step@{STARVED_AT}", FED_AT: f"1:pause_at_step@{FED_AT}"}
HOLD_LABEL = "2:pause_in_checkpoint@20"
# keep_last=1: the driverless ranks of the old code deleted step 10 as soon as they committed 20.
EXTRA = [f"controller.worker_lease_s={LEASE_S}", "controller.poll_interval_s=0.05", "checkpoint.keep_last=1",
         "chaos.faults=[" + ", ".join(f"{{kind: pause_at_step, at_step: {step}}}" for step in PAUSES)
         + ", {kind: pause_in_checkpoint, at_step: 20}]"]


@contextlib.contextmanager
def starved(pid: int) -> Iterator[None]:
    """``pid`` held to a tenth of a core by a CPU cgroup; where none can be written (not root),
    by busy loops on every core, as a loaded machine would."""
    if throttle.available():
        with throttle.CpuThrottle(f"runmgr-test-lease-{os.getpid()}", 0.1) as cap:
            cap.add(pid)
            yield
        return
    loops = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(2 * (os.cpu_count() or 1))]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def wait_paused(run: LaunchedRun, step: int) -> dict:
    """Every rank finished ``step`` and waits; the lineage recorded the pause."""
    status = run.wait_for(lambda s: s["state"] == "running" and bool(s["workers"])
                          and s.get("paused_ranks") == sorted(w["rank"] for w in s["workers"])
                          and ChaosState(run.run_dir).has_fired(PAUSES[step]),
                          timeout=600, what=f"every rank paused after step {step}")
    assert status["step"] == step, status
    return status


def committed_steps(run: LaunchedRun) -> list[int]:
    """Steps of the checkpoints that verify (manifest written last, files intact)."""
    return [step_of(path) for path in list_checkpoints(run.run_dir / "checkpoints") if verify_checkpoint(path)[0]]


def recorded_checkpoints(run: LaunchedRun) -> list[int]:
    return [e["step"] for e in runmgr_json_lines("logbook", "events", str(run.run_dir), "--json")
            if e["type"] == "checkpoint"]


def starve_and_feed(run: LaunchedRun) -> tuple[list[dict], dict]:
    """Starve the driver from step 5 (three leases without any CPU) until the ranks trained on to
    step 8 under it; the workers at step 5, and the status at step 8."""
    workers = wait_paused(run, STARVED_AT)["workers"]
    with starved(run.proc.pid):
        os.kill(run.proc.pid, signal.SIGSTOP)  # no CPU at all: the driver drains nobody ...
        try:
            time.sleep(3 * LEASE_S)  # ... for three leases (the scenario, not a wait for a result)
        finally:
            os.kill(run.proc.pid, signal.SIGCONT)
        release_file(run.run_dir, PAUSES[STARVED_AT]).touch()
        fed = wait_paused(run, FED_AT)  # the ranks trained on after the starvation, the driver still starved
    release_file(run.run_dir, PAUSES[FED_AT]).touch()
    return workers, fed


@pytest.fixture(scope="module")
def killed_in_write(tmp_path_factory) -> dict:
    """The lineage's first launch: starved from step 5 to 8, killed while rank 0 holds inside the
    write of checkpoint 20. What it looked like then, and after the kill."""
    run = LaunchedRun(tmp_path_factory.mktemp("lease") / "starved-then-killed", extra=EXTRA).start()
    workers, fed = starve_and_feed(run)
    holding = run.wait_for(lambda s: s["state"] == "running" and 0 in s.get("paused_ranks", [])
                           and ChaosState(run.run_dir).has_fired(HOLD_LABEL),
                           what="rank 0 holding inside the write of checkpoint 20")
    in_write = {"files_of_20": (run.run_dir / "checkpoints" / "step_00000020").is_dir(),
                "committed": committed_steps(run), "recorded": recorded_checkpoints(run),
                "recorded_step": max(kept_losses(run.run_dir))}
    run.kill_driver()
    release_file(run.run_dir, HOLD_LABEL).touch()  # a driverless rank 0 would now commit 20 and train on
    gone = all(pid_gone(w["pid"], timeout=LEASE_S + MARGIN_S) for w in holding["workers"])
    return {"run": run, "workers": workers, "fed": fed, "in_write": in_write, "workers_gone": gone,
            "committed_after_kill": committed_steps(run),
            "events": runmgr_json_lines("logbook", "events", str(run.run_dir), "--json")}


def test_a_starved_driver_keeps_its_workers_and_a_killed_one_loses_them_within_the_lease(killed_in_write):
    fed = killed_in_write["fed"]
    assert fed["subrun"] == "1.00" and fed["workers"] == killed_in_write["workers"], \
        "the starved driver lost its workers"
    assert killed_in_write["workers_gone"], "workers outlived the driver"
    events = killed_in_write["events"]
    assert [e for e in events if e["type"] == "incident"] == []
    assert {e["subrun"] for e in events} == {"1.00"}


def test_a_driver_killed_inside_a_checkpoint_write_loses_only_the_steps_since_its_newest_recorded_checkpoint(
        killed_in_write, shared_ray):
    run, in_write = killed_in_write["run"], killed_in_write["in_write"]
    # Inside the write: 20's files are there, its manifest is not; 10 is the newest the driver recorded.
    assert in_write["files_of_20"] and in_write["committed"] == [10]
    assert in_write["recorded"] == [10]
    recorded_step = in_write["recorded_step"]
    assert recorded_step > 20
    assert killed_in_write["committed_after_kill"] == [10], "ranks without a driver committed or deleted a checkpoint"

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
