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


NODE_A = "3f2a9c1e" + "0" * 48
NODE_B = "b7d41e09" + "1" * 48
"""Ray node ids are 56 hex digits."""


def workers_started(book: Logbook, subrun_id: str, clock: FakeClock) -> None:
    clock.advance(1.5)
    workers = [{"rank": r, "pid": 3100 + r, "node": node, "node_ip": "192.0.2.2"}
               for r, node in ((0, NODE_A), (1, NODE_B))]
    book.record_event(subrun_id, "workers_started", f"{len(workers)} workers started", {"workers": workers})


def incident_dict(kind: str, description: str, onset_step, ranks=(), nodes=(), evidence=None) -> dict:
    """What runmgr's Incident.to_dict() writes."""
    return {"kind": kind, "time": T0, "description": description, "subrun": "1.00", "onset_step": onset_step,
            "peak_step": onset_step, "recovered": False, "ranks": list(ranks), "nodes": list(nodes),
            "onset_sample": None, "samples_per_step": 16, "evidence": dict(evidence or {})}


def decision_dict(action: str, reason: str, **changes) -> dict:
    """What runmgr's Decision.to_dict() writes."""
    return {"action": action, "reason": reason, "restart_from_step": changes.get("restart_from_step"),
            "skip_ranges": changes.get("skip_ranges", []), "lr_factor": changes.get("lr_factor", 1.0),
            "clip_grad": changes.get("clip_grad"), "reset_optimizer": changes.get("reset_optimizer", False),
            "rewarmup_iters": changes.get("rewarmup_iters", 0),
            "exclude_nodes": changes.get("exclude_nodes", []), "dump_stacks": False}


def judged(book: Logbook, subrun_id: str, incident: dict, decision: dict, last_step: int) -> str:
    """Record an incident and its decision and end the sub-run the way the controller does."""
    summary = f"{incident['kind']}" + (f" at step {incident['onset_step']}" if incident["onset_step"] else "")
    summary += f": {incident['description']}"
    incident_id = book.record_incident(subrun_id, incident["kind"], summary, incident,
                                       step=incident["onset_step"], ranks=incident["ranks"], nodes=incident["nodes"])
    book.record_decision(subrun_id, incident_id, decision["action"], decision["reason"], decision)
    book.end_subrun(subrun_id, "restarting", last_step, f"{decision['action']}: {summary}")
    return summary


def write_controller_run(run_dir: Path) -> ScriptedRun:
    """What runmgr's LogbookObserver writes for a demo run: 1.00 loses rank 1 (kill -9) at step 23;
    1.01 resumes from step 10 (step 20's checkpoint is rejected) and spikes at step 30; 1.02 rolls
    back with a skip range, half the LR, lower clipping, an Adam reset and node B excluded, and
    fails when the spike comes back with the budget spent."""
    run = ScriptedRun(run_dir, FakeClock())
    config = {"run": {"name": "demo", "number": 1, "dir": str(run_dir)}, "optim": {"lr": 3e-3, "clip_grad": 1.0},
              "training": {"train_iters": 40, "seed": 1234}}
    plan = {"subrun": "1.00", "start_checkpoint": None, "skip_ranges": [], "lr_scale": 1.0, "rewarmup_iters": 0,
            "clip_grad": None, "reset_optimizer": False}
    ckpt = str(run_dir / "checkpoints" / "step_{:08d}")
    with Logbook.open(run_dir, clock=run.clock) as book:
        health = {"check_id": "hc-1", "skipped": False, "summary": {"nodes": 2, "admit": 2, "warn": 0, "exclude": 0},
                  "excluded": {}, "admitted": [NODE_A, NODE_B], "lemons": [], "report": str(run_dir / "health" / "hc-1.json")}
        book.start_subrun("1.00", "launch", {"health": health}, None, 0, plan, config)
        workers_started(book, "1.00", run.clock)
        train(book, run, "1.00", 1, 23, checkpoint_every=10)
        death = incident_dict("worker_death", f'rank 1 on {NODE_B} died: process killed (exit code -9)', None,
                              ranks=[1], nodes=[NODE_B], evidence={"cause": "killed", "category": "killed",
                                                                  "exit_code": -9, "line": ""})
        restart = decision_dict("restart", "rank 1 died (killed); restart from the newest verified checkpoint",
                                restart_from_step=20)
        death_summary = judged(book, "1.00", death, restart, 23)
        run.clock.advance(4.0)

        rejected = [[ckpt.format(20), f"checksum mismatch in {ckpt.format(20)}/model.pt"]]
        book.start_subrun("1.01", death_summary, {
            "incident": death, "decision": restart, "resumed_from": ckpt.format(10), "resumed_step": 10,
            "last_step": 23, "steps_lost": 13, "rejected_checkpoints": rejected, "excluded_nodes": []},
            ckpt.format(10), 10, {**plan, "subrun": "1.01", "start_checkpoint": ckpt.format(10)}, config)
        for path, reason in rejected:
            book.record_event("1.01", "checkpoint_rejected", f"checkpoint {path} rejected: {reason}",
                              {"path": path, "reason": reason})
        workers_started(book, "1.01", run.clock)
        train(book, run, "1.01", 11, 33, checkpoint_every=10)
        spike = incident_dict("loss_spike", "loss 9.1 at step 30 is 3.4x the running median 2.7", 30,
                              evidence={"baseline": 2.7, "peak": 9.1, "z": 14.2})
        rollback = decision_dict("rollback_skip", "loss spike did not recover within 3 steps; roll back to step 20 "
                                 "and skip the samples of steps 28-33", restart_from_step=20,
                                 skip_ranges=[[432, 528]], lr_factor=0.5, clip_grad=0.5, reset_optimizer=True,
                                 rewarmup_iters=5, exclude_nodes=[NODE_B])
        judged(book, "1.01", spike, rollback, 33)
        run.clock.advance(3.0)

        new_plan = {**plan, "subrun": "1.02", "start_checkpoint": ckpt.format(20), "skip_ranges": [[432, 528]],
                    "lr_scale": 0.5, "clip_grad": 0.5, "reset_optimizer": True, "rewarmup_iters": 5}
        book.start_subrun("1.02", f"loss_spike at step 30: {spike['description']}", {
            "incident": spike, "decision": rollback, "resumed_from": ckpt.format(20), "resumed_step": 20,
            "last_step": 33, "steps_lost": 13, "rejected_checkpoints": [], "excluded_nodes": [NODE_B]},
            ckpt.format(20), 20, new_plan, config)
        workers_started(book, "1.02", run.clock)
        train(book, run, "1.02", 21, 36, checkpoint_every=10)
        reason = "the loss spiked again at step 35 and the rollback budget (1) is spent: a person must look"
        book.record_event("1.02", "needs_human", reason, {"last_step": 36})
        book.end_subrun("1.02", "failed", 36, reason)
    return run


@pytest.fixture
def controller_run(tmp_path: Path) -> ScriptedRun:
    return write_controller_run(tmp_path / "runs" / "demo")
