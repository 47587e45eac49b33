"""The controller: a state machine stepped one transition at a time.

It executes; it does not judge. Failure handling asks a small decision
function, and every transition goes through :meth:`Controller._transition`,
which checks it is allowed and tells the observers (logbook, progress,
status file). Tests step it with a fake worker group.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable, Protocol

from runmgr.controller.states import (
    ALLOWED, Failed, Finished, Launching, Restarting, Running, State, is_terminal,
)
from runmgr.errors import ClusterError
from runmgr.resume import ResumePoint
from runmgr.workers.group import GroupPoll, WorkerFailure, WorkerGroup, root_cause
from trainer.config import TrainerConfig


class Observer(Protocol):
    """Sees every transition and every poll; must not change the run."""

    def on_transition(self, old: State | None, new: State) -> None:
        """``old`` is None for the initial state."""

    def on_poll(self, state: Running, poll: GroupPoll) -> None: ...


class SubrunIds:
    """Numbers sub-runs ``<run>.00``, ``<run>.01``, ... from a starting index."""

    def __init__(self, run_number: int, next_index: int) -> None:
        self.run_number = run_number
        self.next_index = next_index

    def take(self) -> str:
        index, self.next_index = self.next_index, self.next_index + 1
        return f"{self.run_number}.{index:02d}"


class TransitionError(RuntimeError):
    """A transition the state machine does not allow: a bug in the controller."""


class Controller:
    """Drives sub-runs until the run finishes or needs a person."""

    def __init__(
        self,
        initial: Launching,
        trainer_config: TrainerConfig,
        make_group: Callable[[], WorkerGroup],
        find_resume_point: Callable[[int], ResumePoint],
        subrun_ids: SubrunIds,
        max_restarts: int,
        poll_interval_s: float,
        observers: list[Observer] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.state: State = initial
        self.trainer_config = trainer_config
        self.make_group = make_group
        self.find_resume_point = find_resume_point
        self.subrun_ids = subrun_ids
        self.max_restarts = max_restarts
        self.poll_interval_s = poll_interval_s
        self.observers = list(observers or [])
        self.clock = clock
        self.restarts = 0
        self.last_step = initial.start_step
        self._group: WorkerGroup | None = None
        self._finished_ranks: set[int] = set()

    def run(self) -> State:
        """Announce the initial state, then step until a terminal state;
        always leaves no worker behind."""
        for observer in self.observers:
            observer.on_transition(None, self.state)
        try:
            while not is_terminal(self.state):
                self.step()
        finally:
            self._stop_group()
        return self.state

    def step(self) -> State:
        """Perform one transition (or one poll while running)."""
        handlers = {Launching: self._launch, Running: self._watch, Restarting: self._restart}
        new = handlers[type(self.state)](self.state)
        if new is not self.state:
            self._transition(new)
        return self.state

    def _transition(self, new: State) -> None:
        if type(new) not in ALLOWED[type(self.state)]:
            raise TransitionError(f"{type(self.state).__name__} -> {type(new).__name__} is not allowed")
        old, self.state = self.state, new
        for observer in self.observers:
            observer.on_transition(old, new)

    def _launch(self, state: Launching) -> State:
        self.last_step = state.start_step
        self._finished_ranks = set()
        self._group = self.make_group()
        try:
            workers = self._group.start(self.trainer_config, state.plan)
        except ClusterError as exc:
            self._stop_group()
            return Failed(state.subrun, str(exc), self.last_step)
        return Running(state.subrun, state.plan, state.start_step, tuple(workers))

    def _watch(self, state: Running) -> State:
        assert self._group is not None
        poll = self._group.poll(self.poll_interval_s)
        if poll.steps:
            self.last_step = max(self.last_step, poll.steps[-1].step)
        for observer in self.observers:
            observer.on_poll(state, poll)
        if poll.failures:
            self._stop_group()
            return self._worker_lost(state, root_cause(poll.failures))
        self._finished_ranks |= set(poll.finished_ranks)
        if state.workers and len(self._finished_ranks) >= len(state.workers):
            self._stop_group()
            return Finished(state.subrun, self.last_step)
        return state

    def _worker_lost(self, state: Running, failure: WorkerFailure) -> Restarting:
        where = f"rank {failure.rank}"
        if failure.worker is not None:
            where += f", pid {failure.worker.pid}, node {failure.worker.node_ip}"
        verb = "died" if failure.kind == "died" else "failed"
        evidence = {
            "rank": failure.rank, "failure": failure.kind, "text": failure.text,
            "worker": failure.worker.to_dict() if failure.worker else None, "last_step": self.last_step,
        }
        return Restarting(state.subrun, state.plan, f"worker lost: {where} {verb} at step {self.last_step}",
                          evidence, self.last_step)

    def _restart(self, state: Restarting) -> State:
        if self.restarts >= self.max_restarts:
            return Failed(state.subrun, f"restart budget exhausted ({self.restarts} of {self.max_restarts} used); "
                          f"last incident: {state.incident}", state.last_step)
        self.restarts += 1
        point = self.find_resume_point(state.last_step)
        subrun = self.subrun_ids.take()
        plan = replace(state.plan, subrun=subrun, start_checkpoint=point.path)
        evidence = {
            **state.evidence,
            "resumed_from": point.path, "resumed_step": point.step,
            "steps_lost": max(0, state.last_step - point.step),
            "rejected_checkpoints": [list(r) for r in point.rejected],
        }
        return Launching(subrun, plan, point.step, state.incident, evidence)

    def _stop_group(self) -> None:
        if self._group is not None:
            group, self._group = self._group, None
            group.shutdown()
