"""Fixtures of the chaos tests: real processes to inject faults into, and the
states and polls the controller hands to its observers."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from runmgr.controller.states import Running
from runmgr.controller.group import WorkerInfo
from runmgr.controller.group import GroupPoll
from trainer.plan import ResumePlan, SkipRange
from trainer.report import StepReport

GLOBAL_BATCH = 16


def wait_until(predicate, timeout_s: float = 5.0, every_s: float = 0.01) -> bool:
    """Poll ``predicate`` until it holds or ``timeout_s`` passes; its last value."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(every_s)
    return bool(predicate())


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as handle:
        text = handle.read()
    return text[text.rindex(")") + 2]


@pytest.fixture
def sleeper():
    """Start real ``sleep`` processes; every one is resumed and killed at the end."""
    started: list[subprocess.Popen] = []

    def start() -> subprocess.Popen:
        proc = subprocess.Popen(["sleep", "60"])
        started.append(proc)
        assert wait_until(lambda: _state(proc.pid) == "S"), "the sleeper did not start"
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
        proc.wait(timeout=5)


def worker_of(rank: int, proc: subprocess.Popen, node_id: str = "a1" * 28) -> WorkerInfo:
    return WorkerInfo(rank=rank, pid=proc.pid, node_id=node_id, node_ip="127.0.0.1")


def running(workers, subrun: str = "1.00", start_step: int = 0, skip_ranges=()) -> Running:
    plan = ResumePlan(subrun=subrun, skip_ranges=tuple(SkipRange(a, b) for a, b in skip_ranges))
    return Running(subrun, plan, start_step, tuple(workers))


def step_report(step: int, subrun: str = "1.00", consumed: int | None = None, lr: float = 1e-3) -> StepReport:
    """Rank 0's report of ``step`` in an uninterrupted run of GLOBAL_BATCH samples per step."""
    return StepReport(subrun=subrun, step=step, loss=2.5, grad_norm=1.0, lr=lr, loss_scale=1.0, tokens=2048,
                      consumed_samples=step * GLOBAL_BATCH if consumed is None else consumed, step_time=0.1,
                      compute_times=(0.05, 0.05), skipped=False, time=time.time())


def poll_of(*reports: StepReport) -> GroupPoll:
    return GroupPoll(steps=list(reports))
