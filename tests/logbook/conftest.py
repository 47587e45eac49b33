"""Shared fixtures for the logbook tests: a hand-driven clock and a scripted
three-sub-run lineage shaped like OPT's (lost worker, then a loss spike)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from logbook import Logbook

T0 = 1_700_000_000.0
STEP_TIME = 0.5


@dataclass
class FakeClock:
    """A clock the test moves by hand."""

    now: float = T0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class ScriptedRun:
    """A logbook written by :func:`write_scripted_run`, and what went into it."""

    run_dir: Path
    clock: FakeClock
    recorded: dict = field(default_factory=dict)
    """(subrun, step) -> the metrics row as recorded."""
    incident_ids: list = field(default_factory=list)


def metric_row(step: int) -> dict:
    # Floats whose decimal forms are long, so an inexact round trip shows.
    return {"step": step, "loss": 3.0 / (1.0 + step / 7.0), "grad_norm": 0.1 + 0.2 * step,
            "lr": 3e-4 * (step / 200.0) ** 0.5, "loss_scale": 1.0, "tokens": 4096,
            "step_time": STEP_TIME, "time": T0 + step / 3.0, "skipped": False}


def train(book: Logbook, run: ScriptedRun, subrun_id: str, first: int, last: int, checkpoint_every: int = 20):
    """Record steps first..last one per call, as the driver would, with checkpoints."""
    for step in range(first, last + 1):
        run.clock.advance(STEP_TIME)
        row = metric_row(step)
        book.record_metrics(subrun_id, [row])
        run.recorded[(subrun_id, step)] = row
        if step % checkpoint_every == 0:
            book.record_checkpoint(subrun_id, step, str(run.run_dir / "checkpoints" / f"step_{step:08d}"), 0.25)


def write_scripted_run(run_dir: Path) -> ScriptedRun:
    """7.00 loses a worker at 67; 7.01 resumes from 60 and spikes at 118;
    7.02 rolls back to 100 with a skip range and half the LR and finishes at 200."""
    run = ScriptedRun(run_dir, FakeClock())
    config = {"optim": {"lr": 3e-4, "clip_grad": 1.0}, "train": {"train_iters": 200}}
    plan = {"lr_scale": 1.0, "skip_ranges": [], "reset_optimizer": False}
    with Logbook.open(run_dir, clock=run.clock) as book:
        first = book.next_subrun_id(7)
        book.start_subrun(first, "launch", {}, None, 0, plan, config)
        train(book, run, first, 1, 67)
        evidence = {"rank": 1, "pid": 4242, "error": "ActorDiedError: the actor died unexpectedly"}
        incident = book.record_incident(first, "worker_lost", "rank 1 died", evidence, step=67, ranks=[1], nodes=["node-b"])
        run.incident_ids.append(incident)
        book.record_decision(first, incident, "restart", "a worker died; resume from the last checkpoint", plan)
        book.end_subrun(first, "restarting", 67, "worker lost")
        run.clock.advance(10.0)

        second = book.next_subrun_id(7)
        book.start_subrun(second, "worker lost", evidence, str(run_dir / "checkpoints" / "step_00000060"), 60, plan, config)
        train(book, run, second, 61, 120)
        spike = book.record_incident(second, "loss_spike", "loss 9.1 at step 118, 3.4x the running median",
                                     {"loss": 9.1, "median": 2.7}, step=118)
        run.incident_ids.append(spike)
        new_plan = {"lr_scale": 0.5, "skip_ranges": [[3200, 3328]], "reset_optimizer": False}
        book.record_decision(second, spike, "rollback_skip_lower_lr", "spike did not recover in 2 steps", new_plan)
        book.end_subrun(second, "restarting", 120, "rolling back after loss spike")
        run.clock.advance(20.0)

        third = book.next_subrun_id(7)
        lowered = {"optim": {"lr": 1.5e-4, "clip_grad": 1.0}, "train": {"train_iters": 200}}
        book.start_subrun(third, "loss spike", {"incident": spike}, str(run_dir / "checkpoints" / "step_00000100"),
                          100, new_plan, lowered)
        book.record_event(third, "health_report", "4/4 nodes healthy", {"excluded": []})
        train(book, run, third, 101, 200)
        book.end_subrun(third, "finished", 200, None)
    return run


@pytest.fixture
def scripted_run(tmp_path: Path) -> ScriptedRun:
    return write_scripted_run(tmp_path / "runs" / "seven")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()
