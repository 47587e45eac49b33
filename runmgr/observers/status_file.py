"""Keeps ``status.json`` current: state, sub-run, step and the workers."""

from __future__ import annotations

import os
import time
from pathlib import Path

from runmgr.controller.states import AwaitingApproval, Failed, Finished, Launching, Restarting, Running, State
from runmgr.status import write_status
from runmgr.controller.judgement import Judgement
from runmgr.controller.group import GroupPoll
from trainer.report import PAUSED

STATE_NAMES = {Launching: "launching", Running: "running", AwaitingApproval: "awaiting_approval",
               Restarting: "restarting", Finished: "finished", Failed: "failed"}


class StatusFileObserver:
    """Writes the run's live state after every transition and poll."""

    def __init__(self, run_dir: Path, run_name: str, train_iters: int, start_step: int,
                 metrics_address: str | None = None) -> None:
        """``metrics_address``: where the driver serves Prometheus metrics (None: it serves none)."""
        self.run_dir = run_dir
        self.status: dict = {
            "run": run_name, "run_dir": str(run_dir), "driver_pid": os.getpid(), "train_iters": train_iters,
            "state": "launching", "subrun": None, "step": start_step, "workers": [], "last_incident": None,
            "paused_ranks": [], "metrics": {"address": metrics_address} if metrics_address else None,
            "ready_spares": None,
        }
        self._phases: dict[int, str] = {}

    def on_transition(self, old: State | None, new: State) -> None:
        self.status["state"] = STATE_NAMES[type(new)]
        self.status["subrun"] = new.subrun
        self.status["awaiting"] = awaiting_record(new) if isinstance(new, AwaitingApproval) else None
        if isinstance(new, Running) and new.declined is None:
            self.status["workers"] = [w.to_dict() for w in new.workers]
            self._phases, self.status["paused_ranks"] = {}, []
        elif isinstance(new, Launching):
            self.status["step"] = new.start_step
        elif isinstance(new, Restarting):
            self.status["workers"] = []
            if not new.judgement.decision.warm:  # a cold restart starts a group with spares not yet ready
                self.status["ready_spares"] = None
        elif isinstance(new, Failed):
            self.status["last_incident"] = new.reason
        self._write()

    def on_judgement(self, state: Running, judgement: Judgement) -> None:
        self.status["last_incident"] = f"{judgement.incident.summary()} -> {judgement.decision.action}"

    def on_poll(self, state: Running, poll: GroupPoll) -> None:
        # Written on every poll: updated_at tells a relaunch when the driver was last alive.
        if poll.steps:
            self.status["step"] = poll.steps[-1].step
        # Ranks held between two steps (chaos's pause_at_step): a test acts once all are.
        self._phases.update((beat.rank, beat.phase) for beat in [*poll.heartbeats, *poll.pause_beats])
        self.status["paused_ranks"] = sorted(rank for rank, phase in self._phases.items() if phase == PAUSED)
        if poll.ready_spares is not None:  # a warm group's ready spares (docs/warm_restart.md)
            self.status["ready_spares"] = poll.ready_spares
        self._write()

    def _write(self) -> None:
        self.status["updated_at"] = time.time()
        write_status(self.run_dir, self.status)


def awaiting_record(state: AwaitingApproval) -> dict:
    """The remedy a run holds for a person, as ``runmgr status`` and ``runmgr approve`` read it."""
    incident, decision = state.judgement.incident, state.judgement.decision
    return {"action": str(decision.action), "incident": incident.summary(), "step": incident.onset_step,
            "reason": decision.reason}
