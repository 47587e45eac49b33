"""A relaunch after its driver was lost waits out the lost driver's worker lease, so that no
worker of the old driver trains beside the new sub-run; after a driver that ended (finished,
failed, stopped on request) it waits for nothing. The clock and the sleep are the test's."""

from __future__ import annotations

import io

import pytest

from runmgr.lineage import wait_for_lost_workers
from runmgr.status import mark_stopped, write_status

NO_SUCH_PID = 2 ** 22 + 12345
WORKER = {"rank": 0, "node": "node-0", "pid": 4242}


def relaunch_waits(run_dir, status: dict, now: float, lease_s: float = 10.0) -> list[float]:
    write_status(run_dir, status)
    slept: list[float] = []
    out = io.StringIO()
    wait_for_lost_workers(run_dir, lease_s, out, clock=lambda: now, sleep=slept.append)
    return slept


def test_a_lost_driver_s_workers_are_waited_for_until_their_lease_runs_out(tmp_path):
    lost = {"state": "running", "driver_pid": NO_SUCH_PID, "workers": [WORKER], "updated_at": 1000.0}
    # The lease (10 s) and a second's margin from the driver's last word, less the 4 s gone since.
    assert relaunch_waits(tmp_path, lost, now=1004.0) == [pytest.approx(7.0)]
    assert relaunch_waits(tmp_path, lost, now=1020.0) == []  # long gone: nothing left to wait for


def test_nothing_is_waited_for_after_a_driver_that_ended_or_had_no_workers(tmp_path):
    ended = {"state": "finished", "driver_pid": NO_SUCH_PID, "workers": [WORKER], "updated_at": 1000.0}
    assert relaunch_waits(tmp_path, ended, now=1001.0) == []
    no_workers = {"state": "running", "driver_pid": NO_SUCH_PID, "workers": [], "updated_at": 1000.0}
    assert relaunch_waits(tmp_path, no_workers, now=1001.0) == []
    write_status(tmp_path, {"state": "running", "driver_pid": NO_SUCH_PID, "workers": [WORKER], "updated_at": 1000.0})
    mark_stopped(tmp_path, "stopped on request")
    slept: list[float] = []
    wait_for_lost_workers(tmp_path, 10.0, io.StringIO(), clock=lambda: 1001.0, sleep=slept.append)
    assert slept == []
