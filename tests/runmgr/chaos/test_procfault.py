"""Signals to real processes: the helpers that outlive the driver."""

from __future__ import annotations

import os
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
    # Sampled from the cycle's first stop, not from a guess at when the helper's interpreter is up
    # (beside two busy loops it took longer than the 0.2 s once allowed: 38% stopped was seen).
    assert wait_until(lambda: procfault.process_state(proc.pid) == "T", 10.0)
    samples = []
    deadline = time.monotonic() + 1.0
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
    # Continued, the sleeper is briefly running ("R") before it sleeps again; left stopped, it
    # would stay "T" however long we waited.
    assert wait_until(lambda: procfault.process_state(proc.pid) == "S", 5.0)


def test_the_nice_increment_gives_the_straggler_one_factor_th_of_a_peer_s_cpu_weight():
    # Linux's weights: nice 0 is 1024, nice 5 is 335 (a third), nice 2 is 655, nice 19 is 15.
    assert [procfault.nice_steps(f) for f in (1.25, 1.5, 3.0, 10.0, 1000.0)] == [1, 2, 5, 10, 19]


def test_duty_cycle_lowers_the_priority_of_every_thread_while_it_lasts_and_gives_it_back(tmp_path):
    import subprocess
    import sys

    # A process of three threads: a nice value is a thread's, and torch's ranks have several.
    script = "import threading, time\nfor _ in range(2): threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\ntime.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", script])
    try:
        assert wait_until(lambda: len(procfault._threads(proc.pid)) == 3, 5.0)
        before = {tid: os.getpriority(os.PRIO_PROCESS, tid) for tid in procfault._threads(proc.pid)}
        helper = procfault.spawn_helper(["duty-cycle", proc.pid, 3.0, 0.1, 1.0])
        raised = lambda: all(os.getpriority(os.PRIO_PROCESS, tid) == before[tid] + 5 for tid in before)
        assert wait_until(raised, 3.0), "the helper lowered not every thread's priority"
        assert helper.wait(timeout=5) == 0
        if procfault.can_restore_priority():
            assert {tid: os.getpriority(os.PRIO_PROCESS, tid) for tid in before} == before
        assert procfault.process_state(proc.pid) == "S"
    finally:
        proc.kill()
        proc.wait(timeout=5)
