"""The driver lease: a worker tells a dead driver from a silent one, stops
before it writes or commits a checkpoint without its driver, and says why it
stopped in words the driver classifies as its own kind of death."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from runmgr.config.policy import PolicyConfig
from runmgr.policy.decision import RESTART
from runmgr.policy.faults import decide_fault
from runmgr.policy.history import History
from runmgr.watch.deaths import DeathDetector
from runmgr.watch.observations import WorkerExit
from runmgr.workers.actor import BufferingReporter
from runmgr.workers.lease import (
    EXIT_DRIVER_LOST, CheckDriverBeforeCommit, DriverIdentity, DriverLease, DriverLostError, SelfStop,
    process_start_ticks,
)
from trainer.report import PAUSED, Heartbeat


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def beat(phase: str = "step", step: int = 5) -> Heartbeat:
    return Heartbeat(0, phase, step, 0.0)


def test_a_driver_on_this_machine_is_alive_until_its_process_ends(child):
    driver = replace(DriverIdentity.of_this_process(), pid=child.pid, start_ticks=process_start_ticks(child.pid))
    assert driver.alive_here() is True
    child.kill()
    child.wait()
    assert driver.alive_here() is False


def test_a_zombie_or_a_reused_pid_is_not_the_driver(child):
    driver = replace(DriverIdentity.of_this_process(), pid=child.pid, start_ticks=process_start_ticks(child.pid))
    assert replace(driver, start_ticks=driver.start_ticks - 1).alive_here() is False  # another process, same pid
    child.kill()
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # dead, not yet reaped: a zombie
    assert process_start_ticks(child.pid) is None and driver.alive_here() is False


def test_a_driver_elsewhere_cannot_be_judged_by_its_pid():
    elsewhere = replace(DriverIdentity.of_this_process(), kernel="another-boot-id/4026531836")
    assert elsewhere.alive_here() is None


def test_a_silent_driver_whose_process_lives_is_waited_for_and_said_so(child):
    clock, said = Clock(), []
    driver = replace(DriverIdentity.of_this_process(), pid=child.pid, start_ticks=process_start_ticks(child.pid))
    lease = DriverLease(1.0, driver, clock=clock, say=said.append)
    clock.now += 30  # thirty leases without a drain: starved, stopped, blocked on its disk
    assert lease.lost() is None and lease.lost(before_write=True) is None
    assert len(said) == 1 and "not dead; training on" in said[0]  # once per silence
    lease.renew()
    assert not lease.expired()


def test_a_driver_on_this_machine_that_is_gone_is_lost_at_once_within_the_lease(child):
    driver = replace(DriverIdentity.of_this_process(), pid=child.pid, start_ticks=process_start_ticks(child.pid))
    lease = DriverLease(10.0, driver, clock=Clock())
    child.kill()
    child.wait()
    lost = lease.lost()
    assert lost is not None and lost.confirmed and f"pid {child.pid}" in lost.reason


@pytest.mark.parametrize("ray_view, within, after", [
    (True, None, None),            # Ray counts the job alive: never lost
    (False, "ended", "ended"),     # Ray says the job ended: lost, even within the lease before a write
    (None, None, "nothing shows it alive"),  # nobody can tell: the lease decides
])
def test_a_driver_elsewhere_is_judged_by_ray_then_by_the_lease(ray_view, within, after):
    clock = Clock()
    elsewhere = replace(DriverIdentity.of_this_process(), kernel="another-boot-id/1")
    lease = DriverLease(10.0, elsewhere, job_alive=lambda: ray_view, clock=clock, say=lambda text: None)
    assert lease.lost() is None  # within the lease Ray is not even asked ...
    before_write = lease.lost(before_write=True)  # ... except before a checkpoint is written
    clock.now += 11
    past_lease = lease.lost()
    for verdict, expected in ((before_write, within), (past_lease, after)):
        assert verdict is None if expected is None else expected in verdict.reason
    if past_lease is not None:
        assert past_lease.confirmed == (ray_view is False)  # only Ray's word confirms a driver elsewhere gone


def test_the_training_stops_at_the_next_beat_and_never_reaches_a_checkpoint_write(child):
    driver = replace(DriverIdentity.of_this_process(), pid=child.pid, start_ticks=process_start_ticks(child.pid))
    stop = SelfStop(DriverLease(10.0, driver, clock=Clock()), rank=1, exit=lambda code: None)
    reporter = BufferingReporter(gate=stop.gate)
    reporter.heartbeat(beat("checkpoint"))  # alive: the checkpoint may be written
    child.kill()
    child.wait()
    # Checked there and then, not at the watch's next tick: no write, no commit.
    gone = r"\(rank 1\) stopped itself: its driver \(pid \d+, on this machine\) is gone"
    with pytest.raises(DriverLostError, match=gone):
        reporter.heartbeat(beat("checkpoint", 6))
    with pytest.raises(DriverLostError):
        reporter.heartbeat(beat(PAUSED, 6))  # a paused rank stops too
    assert [item.phase for kind, item in reporter.take()] == ["checkpoint"]


def test_the_watch_ends_the_process_at_once_when_the_driver_is_gone(child):
    exits, said = [], []
    driver = replace(DriverIdentity.of_this_process(), pid=child.pid, start_ticks=process_start_ticks(child.pid))
    kill_on_first_sleep = lambda seconds: (child.kill(), child.wait())  # noqa: E731
    stop = SelfStop(DriverLease(10.0, driver, clock=Clock(), say=said.append), rank=0, exit=exits.append,
                    sleep=kill_on_first_sleep)
    stop.idle.clear()  # training runs: not waited for, nobody is left to read why
    stop.watch()
    assert exits == [EXIT_DRIVER_LOST] and "stopped itself" in said[-1]


def test_an_unconfirmed_loss_lets_the_training_end_with_its_reason_before_the_process_ends():
    clock, exits, sleeps = Clock(), [], []
    elsewhere = replace(DriverIdentity.of_this_process(), kernel="another-boot-id/1")
    lease = DriverLease(10.0, elsewhere, clock=clock, say=lambda text: None)
    stop = SelfStop(lease, rank=0, exit=exits.append, sleep=sleeps.append)
    clock.now += 11  # silent past the lease, nothing shows it alive (it may be: tell it why)
    stop.watch()  # the training is idle here: no wait for it
    assert exits == [EXIT_DRIVER_LOST] and sleeps, "a moment for Ray to hand over the error"
    with pytest.raises(DriverLostError) as raised:
        stop.gate(beat())
    # The driver, if it is there, reads a death of its own kind, restarted, not a kill.
    incident, = DeathDetector().update(WorkerExit(0, "node-a", f"Traceback ...\n{raised.type.__name__}: "
                                                  f"{raised.value}", 1.0, subrun="1.00"), 1.0)
    assert incident.evidence["category"] == "driver_lost" and "stopped itself" in incident.description
    assert decide_fault(incident, History(), PolicyConfig(), checkpoints=[]).action == RESTART


def test_ray_counts_the_job_of_a_live_driver_alive(local_ray):
    """Ray's view, asked from a worker process: the test process is its live driver."""
    from runmgr.workers.lease import ray_job_alive

    assert local_ray.get(local_ray.remote(ray_job_alive).remote()) is True


def test_a_worker_whose_silent_driver_ray_counts_alive_keeps_going(local_ray):
    """A worker on a real Ray, with a driver it cannot see (another machine, as far as
    it knows) and a lease that ran out long ago: Ray says the job lives, so it waits."""
    import time

    from runmgr.workers.actor import RemoteTrainerWorker

    elsewhere = replace(DriverIdentity.of_this_process(), kernel="another-boot-id/1")
    worker = RemoteTrainerWorker.options(num_cpus=0).remote(0, 1, 0.2, elsewhere)
    first = local_ray.get(worker.describe.remote())
    time.sleep(3.0)  # fifteen leases without a drain (describe does not renew it)
    assert local_ray.get(worker.describe.remote(), timeout=30).pid == first.pid
    local_ray.kill(worker)


def test_a_forked_rank_checks_its_driver_itself_before_a_checkpoint_write(child):
    """A rank forked by a node agent (runmgr/agents/rank_processes.py) has no drain to renew a
    lease: before a checkpoint write or commit it checks a driver on its machine there and then."""
    driver = replace(DriverIdentity.of_this_process(), pid=child.pid, start_ticks=process_start_ticks(child.pid))
    buffer = BufferingReporter()
    reporter = CheckDriverBeforeCommit(driver)(buffer, None)
    reporter.heartbeat(Heartbeat(3, "checkpoint", 5, 0.0))  # alive: the checkpoint may be written
    child.kill()
    child.wait()
    reporter.heartbeat(Heartbeat(3, "step", 6, 0.0))  # only a write or a commit waits for the check
    with pytest.raises(DriverLostError, match=r"\(rank 3\) stopped itself: its driver \(pid \d+, on this machine\)"):
        reporter.heartbeat(Heartbeat(3, "checkpoint", 6, 0.0))
    assert [(item.phase, item.step) for kind, item in buffer.take()] == [("checkpoint", 5), ("step", 6)]


def test_a_push_s_answer_renews_the_lease_as_of_the_driver_s_last_drain():
    clock = Clock()
    lease = DriverLease(10.0, clock=clock)
    clock.now += 8
    lease.renew(silent_s=3.0)  # the driver drained 3 s ago
    clock.now += 8
    assert lease.expired() and round(lease.silent_s()) == 11
    lease.renew(silent_s=20.0)  # an older news never moves the renewal back
    assert round(lease.silent_s()) == 11
