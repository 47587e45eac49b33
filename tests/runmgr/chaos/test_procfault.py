"""Signals to real processes: the helpers that outlive the driver."""

from __future__ import annotations

import signal
import time

from runmgr.chaos import procfault
from tests.runmgr.chaos.conftest import wait_until


def test_state_reads_running_stopped_and_gone(sleeper):
    proc = sleeper()
    assert procfault.process_state(proc.pid) == "S"
    procfault.send(proc.pid, signal.SIGSTOP)
    assert wait_until(lambda: procfault.process_state(proc.pid) == "T")
    procfault.send(proc.pid, signal.SIGKILL)
    proc.wait(timeout=5)
    assert procfault.process_state(proc.pid) is None
    assert not procfault.alive(proc.pid)


def test_resume_after_helper_continues_a_stopped_process(sleeper):
    proc = sleeper()
    procfault.send(proc.pid, signal.SIGSTOP)
    helper = procfault.spawn_helper(["resume-after", proc.pid, 0.5])
    assert wait_until(lambda: procfault.process_state(proc.pid) == "T", 1.0)
    assert procfault.process_state(proc.pid) == "T", "resumed too early"
    assert wait_until(lambda: procfault.process_state(proc.pid) == "S", 5.0)
    assert helper.wait(timeout=5) == 0


def test_resume_after_helper_exits_when_its_target_is_gone(sleeper):
    proc = sleeper()
    helper = procfault.spawn_helper(["resume-after", proc.pid, 60])
    proc.kill()
    proc.wait(timeout=5)
    assert helper.wait(timeout=5) == 0  # it does not linger for its 60 s


def test_duty_cycle_stops_the_process_most_of_the_time_then_leaves_it_running(sleeper):
    proc = sleeper()
    helper = procfault.spawn_helper(["duty-cycle", proc.pid, 3.0, 0.15, 1.5])
    samples = []
    deadline = time.monotonic() + 1.2
    time.sleep(0.2)  # the helper's interpreter starts
    while time.monotonic() < deadline:
        samples.append(procfault.process_state(proc.pid))
        time.sleep(0.005)
    stopped = samples.count("T") / len(samples)
    assert 0.4 < stopped < 0.95, f"stopped {stopped:.0%} of the time; a factor-3 cycle stops it ~67%"
    assert helper.wait(timeout=5) == 0
    assert procfault.process_state(proc.pid) == "S"  # never left stopped


def test_duty_cycle_resumes_the_process_when_the_helper_is_terminated(sleeper):
    proc = sleeper()
    helper = procfault.spawn_helper(["duty-cycle", proc.pid, 10.0, 1.0, 60])
    assert wait_until(lambda: procfault.process_state(proc.pid) == "T", 3.0)
    helper.send_signal(signal.SIGTERM)
    helper.wait(timeout=5)
    assert procfault.process_state(proc.pid) == "S"
