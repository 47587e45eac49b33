"""pause_at_step: every rank finishes step N, then waits for its release.
pause_in_checkpoint: rank 0 holds inside the write of checkpoint N, its files
written and its manifest (the commit) not yet, until its release.

A test (or a person) reaches a moment of a run through the run's own state
instead of racing it: the ranks stop between step N and step N+1, the driver
sees them paused (their heartbeats say ``paused``, status.json lists them,
the logbook records the injection), and whoever waits acts (kills a worker,
kills the driver) and then creates the release file, or never does. A rank
gives up waiting after ``duration_s`` (default 600 s), and a rank whose driver
is gone still ends itself at the driver lease, as always.

The ranks act it out themselves, at the exact step boundary, through the
reporter their actor hands to the trainer: the trainer calls
``heartbeat(step N+1)`` before it starts step N+1, and that call waits. The
trainer knows nothing of it; while paused, the rank keeps beating (phase
``paused``), so no watcher takes the pause for a hang.

A checkpoint hold waits in the ``checkpoint`` beat rank 0 sends before it
commits a checkpoint (trainer/loop.py): the first one after step N is the one
before checkpoint N's commit (with asynchronous saves). The other ranks go on
into the next step and wait there for rank 0, silent in a collective.

Each pause acts once per lineage: the driver hands a sub-run only the pauses
that have not fired yet (:meth:`runmgr.chaos.build.Chaos.step_gate`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from typing import Callable, Optional

from runmgr.config.chaos import PAUSE_AT_STEP, PAUSE_IN_CHECKPOINT, FaultKind
from trainer.plan import ResumePlan
from trainer.report import PAUSED, CheckpointReport, Heartbeat, LocalNormsReport, Reporter, StartReport, StepReport

PAUSE_SAFETY_S = 600.0
"""How long the ranks wait for their release when the fault names no duration_s."""
BEAT_EVERY_S = 0.5
"""How often a paused rank says it is alive (and looks for its release)."""


def subrun_index(subrun: str) -> int:
    """``12.03`` -> 3."""
    return int(subrun.rsplit(".", 1)[-1])


@dataclass(frozen=True)
class StepPause:
    """One pause as the ranks carry it out."""

    label: str
    """The fault's label in the schedule (``0:pause_at_step@20``)."""
    after_step: int
    """The ranks finish this step, then wait (at the first step past it, after a resume)."""
    release: str
    """Absolute path of the file whose existence releases them."""
    timeout_s: float
    """The longest they wait."""
    at_subrun: Optional[int] = None
    """Only in sub-runs <run>.NN with NN >= at_subrun (None: any)."""
    in_checkpoint: bool = False
    """pause_in_checkpoint: rank 0 holds before committing checkpoint ``after_step``."""

    @classmethod
    def of_kind(cls, kind: FaultKind, label: str, after_step: int, release: str, timeout_s: float,
                at_subrun: Optional[int]) -> "StepPause":
        return cls(label, after_step, release, timeout_s, at_subrun, in_checkpoint=kind == PAUSE_IN_CHECKPOINT)

    @property
    def kind(self) -> FaultKind:
        return PAUSE_IN_CHECKPOINT if self.in_checkpoint else PAUSE_AT_STEP

    def applies_to(self, subrun: str) -> bool:
        return self.at_subrun is None or subrun_index(subrun) >= self.at_subrun

    def due(self, beat: Heartbeat) -> bool:
        """Whether ``beat`` is the one this pause holds."""
        if self.in_checkpoint:
            return beat.phase == "checkpoint" and beat.rank == 0 and beat.step > self.after_step
        return beat.phase == "step" and beat.step > self.after_step

    def held_at(self, beat: Heartbeat) -> int:
        """The last step finished while held."""
        return beat.step if self.in_checkpoint else beat.step - 1


@dataclass(frozen=True)
class StepGate:
    """The pauses one sub-run's ranks observe; picklable, handed to every rank,
    which wraps its reporter with it (``gate(reporter, plan)``)."""

    pauses: tuple[StepPause, ...]

    def __call__(self, reporter: Reporter, plan: ResumePlan) -> Reporter:
        pending = [pause for pause in self.pauses if pause.applies_to(plan.subrun)]
        return PausingReporter(reporter, pending) if pending else reporter


class PausingReporter:
    """Passes every report on; holds the heartbeat that opens a paused step."""

    def __init__(self, reporter: Reporter, pauses: list[StepPause], clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], None] = time.sleep, beat_every_s: float = BEAT_EVERY_S) -> None:
        self.reporter = reporter
        self.pending = sorted(pauses, key=lambda pause: pause.after_step)
        self.clock = clock
        self.sleep = sleep
        self.beat_every_s = beat_every_s

    def started(self, report: StartReport) -> None:
        self.reporter.started(report)

    def step(self, report: StepReport) -> None:
        self.reporter.step(report)

    def checkpoint(self, report: CheckpointReport) -> None:
        self.reporter.checkpoint(report)

    def local_norms(self, report: LocalNormsReport) -> None:
        self.reporter.local_norms(report)

    def heartbeat(self, beat: Heartbeat) -> None:
        due = [pause for pause in self.pending if pause.due(beat)]
        for pause in due:
            self.pending.remove(pause)
            self._hold(pause, beat)
        # The step starts now: a beat stamped before the pause would read as a silence.
        self.reporter.heartbeat(replace(beat, time=self.clock()) if due else beat)

    def _hold(self, pause: StepPause, beat: Heartbeat) -> None:
        """Beat ``paused`` (at the last finished step) until released or timed out."""
        deadline = self.clock() + pause.timeout_s
        while not os.path.exists(pause.release) and self.clock() < deadline:
            self.reporter.heartbeat(Heartbeat(beat.rank, PAUSED, pause.held_at(beat), self.clock()))
            self.sleep(self.beat_every_s)
