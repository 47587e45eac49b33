"""The driver lease on real processes (issue 9, item 2): a driver starved of
CPU for a whole run keeps its workers; a driver killed with kill -9 loses them
within the lease. A starved driver is not a dead one: a worker stops only when
its driver's process is gone (or, for a driver on another machine, when Ray no
longer counts its job alive).

The run trains with a lease of one second; from step 5 the driver is held to a
tenth of a core (a cgroup quota: a starved driver that starves nothing else),
and gets no CPU at all (SIGSTOP) for three leases; at step 8, once the same
ranks trained on after it, it is killed with kill -9."""

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
from tests.e2e.harness import LaunchedRun, pid_gone, runmgr_json_lines
from tests import throttle

pytestmark = pytest.mark.slow

LEASE_S = 1.0
MARGIN_S = 10.0
STARVED_AT, KILLED_AT = 5, 8
PAUSES = {STARVED_AT: f"0:pause_at_step@{STARVED_AT}", KILLED_AT: f"1:pause_at_step@{KILLED_AT}"}
EXTRA = [f"controller.worker_lease_s={LEASE_S}", "controller.poll_interval_s=0.05",
         "chaos.faults=[" + ", ".join(f"{{kind: pause_at_step, at_step: {step}}}" for step in PAUSES) + "]"]


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


def test_a_starved_driver_keeps_its_workers_and_a_killed_one_loses_them_within_the_lease(tmp_path):
    run = LaunchedRun(tmp_path / "starved", extra=EXTRA).start()
    workers = wait_paused(run, STARVED_AT)["workers"]

    with starved(run.proc.pid):
        os.kill(run.proc.pid, signal.SIGSTOP)  # no CPU at all: the driver drains nobody ...
        try:
            time.sleep(3 * LEASE_S)  # ... for three leases (the scenario, not a wait for a result)
        finally:
            os.kill(run.proc.pid, signal.SIGCONT)
        release_file(run.run_dir, PAUSES[STARVED_AT]).touch()

        status = wait_paused(run, KILLED_AT)  # the ranks trained on after the starvation, the driver still starved
        assert status["subrun"] == "1.00" and status["workers"] == workers, "the starved driver lost its workers"
    run.kill_driver()
    assert all(pid_gone(w["pid"], timeout=LEASE_S + MARGIN_S) for w in workers), "workers outlived the driver"
    release_file(run.run_dir, PAUSES[KILLED_AT]).touch()

    events = runmgr_json_lines("logbook", "events", str(run.run_dir), "--json")
    assert [e for e in events if e["type"] == "incident"] == []
    assert {e["subrun"] for e in events} == {"1.00"}
