"""The chaos injector: an observer of the controller that fires the schedule.

It watches like the other observers (``on_transition``, ``on_poll``) and,
when a fault's trigger is reached, acts on the run's real processes and
files through :class:`runmgr.chaos.actions.FaultEffects`. Data and LR faults
were written into the run's inputs before launch; the injector reports them
when the run first trains on them. Every fault fires once per lineage
(:class:`runmgr.chaos.state.ChaosState`), and each injection is handed to
``on_inject`` for the logbook.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Callable, Optional

from runmgr.chaos.actions import FaultEffects, ReadOnlyMount, TargetMissing, Undo
from runmgr.chaos.garbage import SampleWindow
from runmgr.chaos.pause import StepPause, subrun_index
from runmgr.chaos.state import ChaosState
from runmgr.config.chaos import CHECKPOINT_FAIL, LR_BLOWUP, FaultSpec
from runmgr.controller.states import AwaitingApproval, Failed, Finished, Restarting, Running, State
from trainer.data.sampler import SkipSchedule
from trainer.report import PAUSED, Heartbeat

if TYPE_CHECKING:  # the group module imports ray; the injector only reads the poll
    from runmgr.controller.judgement import Judgement
    from runmgr.controller.group import GroupPoll


@dataclass(frozen=True)
class Injection:
    """One fault acted out (or, with ``injected`` False, one that could not be)."""

    kind: str
    fault: str
    """The fault's label in the schedule (``3:hang_rank@70``)."""
    target: str
    """What it hit: a rank's process, a node, a sample window, the LR schedule."""
    step: Optional[int]
    """Last step reported when it fired."""
    subrun: Optional[str]
    time: float
    detail: str
    """What was done, in one line."""
    injected: bool = True

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        verb = "injected" if self.injected else "NOT injected"
        return f"chaos {verb}: {self.kind} on {self.target} at step {self.step}: {self.detail}"


@dataclass(frozen=True)
class ScheduleShift:
    """A sub-run ended by a death or a hang that no fault of the schedule caused (a person's own
    ``kill -9``, a real fault): the schedule's faults keyed to a sub-run (``at_subrun``) now come
    one sub-run later, so that each still meets the sub-run its story meant (issue 32 item 3)."""

    subrun: str
    step: Optional[int]
    time: float
    shift: int
    """Sub-runs of the lineage that no fault of the schedule ended, this one included."""
    moved: tuple[str, ...]
    """The labels of the faults not yet fired that wait for a sub-run."""
    kind: str = "schedule_shifted"

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        later = (f"{', '.join(self.moved)} now wait{'s' if len(self.moved) == 1 else ''} "
                 f"{self.shift} sub-run{'s' if self.shift != 1 else ''} later than scheduled"
                 if self.moved else "no fault of the schedule waits for a sub-run")
        return (f"chaos: sub-run {self.subrun} ended with no fault of the schedule in it (a fault from outside "
                f"it, such as a person's own kill): {later}, so the story stays the schedule's")


OUTSIDE_KINDS = frozenset({"worker_death", "hang"})
"""What a person's own hand does to a run (``kill -9``, ``kill -STOP``): a sub-run ended so, with
no fault of the schedule fired in it, moves the schedule. A spike is not among them: a data
fault of a job whose lines carry no sample position is in the schedule but never seen here."""

OnInject = Callable[["Injection | ScheduleShift"], None]


@dataclass(frozen=True)
class DataWindow:
    """A garbage window already written into the run's data."""

    label: str
    kind: str
    window: SampleWindow


@dataclass(frozen=True)
class LrBlowup:
    """An LR schedule whose peak the config got wrong."""

    label: str
    intended_lr: float
    mistaken_lr: float
    peak_step: int


@dataclass(frozen=True)
class Schedule:
    """What the injector watches for, as :func:`runmgr.chaos.build.build_chaos` prepared it."""

    runtime: tuple[tuple[str, FaultSpec], ...] = ()
    windows: tuple[DataWindow, ...] = ()
    lr_blowup: Optional[LrBlowup] = None
    global_batch_size: int = 1
    pauses: tuple[StepPause, ...] = ()
    """Carried out by the ranks themselves; the injector records them when it sees them paused."""


def batch_positions(consumed: int, global_batch_size: int, skips: SkipSchedule) -> list[int]:
    """The stream positions of the step that ended at cursor ``consumed``: the last
    ``global_batch_size`` positions before it that no skip range holds."""
    positions: list[int] = []
    position = consumed - 1
    while position >= 0 and len(positions) < global_batch_size:
        if not skips.is_skipped(position):
            positions.append(position)
        position -= 1
    return positions[::-1]


class ChaosInjector:
    """Fires the schedule into the running sub-run; must not otherwise change the run."""

    def __init__(self, schedule: Schedule, effects: FaultEffects, state: ChaosState, on_inject: OnInject,
                 clock: Callable[[], float] = time.time) -> None:
        self.schedule = schedule
        self.effects = effects
        self.state = state
        self.on_inject = on_inject
        self.clock = clock
        self._running_since = 0.0
        self._step: Optional[int] = None
        self._until_sub_run_ends: list[Undo] = []
        self._until_time: list[tuple[float, Undo]] = []
        self._fired_in_subrun = False

    # --- observer protocol -------------------------------------------------

    def on_transition(self, old: State | None, new: State) -> None:
        going_on = (Running, AwaitingApproval)  # a remedy held for a person: the same ranks go on
        if isinstance(old, going_on) and isinstance(new, going_on):
            return
        if isinstance(new, Running):
            # Runtime faults wait for the sub-run's first step report: a rank killed
            # while it loads a checkpoint is a different fault from one killed mid-run.
            self._running_since, self._step, self._fired_in_subrun = self.clock(), None, False
            return
        if isinstance(old, going_on):
            self._undo(self._until_sub_run_ends)  # e.g. the sub-run's storage outage ends with it
            self._until_sub_run_ends = []
            if isinstance(new, Restarting) and not self._fired_in_subrun \
                    and new.judgement.incident.kind in OUTSIDE_KINDS:
                self._shift_schedule(old.subrun, new.last_step)
        if isinstance(new, (Finished, Failed)):
            self.close()

    def on_poll(self, state: Running, poll: GroupPoll) -> None:
        for report in poll.steps:
            self._watch_inputs(state, report)
            self._step = report.step
        for beat in [*poll.heartbeats, *poll.pause_beats]:
            self._watch_pauses(state, beat)
        now = self.clock()
        for label, fault in self.schedule.runtime:
            if not self.state.has_fired(label) and self._due(fault, state, now):
                self._fire(label, fault, state, now)
        self._expire(now)

    def on_judgement(self, state: Running, judgement: Judgement) -> None:
        """Chaos does not read judgements: it must not adapt to the remedies."""

    def close(self) -> None:
        """Undo every fault still in place that has an end (call when the driver stops)."""
        self._undo(self._until_sub_run_ends + [undo for _, undo in self._until_time])
        self._until_sub_run_ends, self._until_time = [], []

    # --- runtime faults ----------------------------------------------------

    def _due(self, fault: FaultSpec, state: Running, now: float) -> bool:
        if self._step is None or self._step < fault.at_step:
            return False
        # The sub-runs that something outside the schedule ended do not count: the fault
        # meets the sub-run of the schedule's story, not the one its number now names.
        if fault.at_subrun is not None and subrun_index(state.subrun) - self.state.shift < fault.at_subrun:
            return False
        return fault.after_seconds is None or now - self._running_since >= fault.after_seconds

    def _fire(self, label: str, fault: FaultSpec, state: Running, now: float) -> None:
        try:
            target, detail, undo = self.effects.apply(fault, state.workers)
        except ProcessLookupError:
            return  # the process is already gone (the sub-run is ending): try in the next sub-run
        except (TargetMissing, OSError) as exc:
            self._record(Injection(fault.kind, label, f"rank {fault.rank}", self._step, state.subrun, now,
                                   f"could not inject: {exc}", injected=False))
            return
        if isinstance(undo, ReadOnlyMount):
            self.state.add_mount(undo.path)  # a relaunch removes it if this driver dies first
        if undo is not None and fault.duration_s is not None:
            self._until_time.append((now + fault.duration_s, undo))
        elif undo is not None and fault.kind == CHECKPOINT_FAIL:
            self._until_sub_run_ends.append(undo)
        self._record(Injection(fault.kind, label, target, self._step, state.subrun, now, detail))

    def _expire(self, now: float) -> None:
        due = [undo for until, undo in self._until_time if until <= now]
        if due:
            self._until_time = [(u, m) for u, m in self._until_time if u > now]
            self._undo(due)

    def _undo(self, undos: list[Undo]) -> None:
        for undo in undos:
            undo.undo()
            if isinstance(undo, ReadOnlyMount):
                self.state.remove_mount(undo.path)

    # --- input faults (written before launch) ------------------------------

    def _watch_inputs(self, state: Running, report) -> None:
        if report.consumed_samples is None:
            return  # a job's line without a believable position: no window can be placed on it
        positions = batch_positions(report.consumed_samples, self.schedule.global_batch_size,
                                    SkipSchedule(state.plan.skip_ranges))
        for item in self.schedule.windows:
            window = item.window
            if self.state.has_fired(item.label) or not any(window.start <= p < window.end for p in positions):
                continue
            self._record(Injection(
                item.kind, item.label, f"samples [{window.start}, {window.end})", report.step, state.subrun,
                report.time, f"step {report.step} trains on stream positions {positions[0]}..{positions[-1]}, "
                             f"inside the garbage window written before launch"))
        blowup = self.schedule.lr_blowup
        if blowup is not None and not self.state.has_fired(blowup.label) and report.lr > blowup.intended_lr * 1.001:
            self._record(Injection(
                LR_BLOWUP, blowup.label, "optim.lr", report.step, state.subrun, report.time,
                f"LR {report.lr:.3g} at step {report.step} is past the intended peak {blowup.intended_lr:.3g}: "
                f"the config asks for {blowup.mistaken_lr:.3g} at step {blowup.peak_step}"))

    # --- pauses (carried out by the ranks) ----------------------------------

    def _watch_pauses(self, state: Running, beat: Heartbeat) -> None:
        if beat.phase != PAUSED:
            return
        pending = [p for p in self.schedule.pauses if not self.state.has_fired(p.label)
                   and p.after_step <= beat.step and p.applies_to(state.subrun)]
        if not pending:
            return
        pause = max(pending, key=lambda p: p.after_step)  # the ranks hold the latest one they passed
        if pause.in_checkpoint:
            target, what = "rank 0", (f"rank 0 holds before committing the checkpoint of step {pause.after_step} "
                                      f"(its files written, its manifest not)")
        else:
            target, what = "every rank", f"the ranks finished step {beat.step}"
        self._record(Injection(
            pause.kind, pause.label, target, beat.step, state.subrun, beat.time,
            f"{what} and wait until {pause.release} exists (at most {pause.timeout_s:.0f} s)"))

    def _record(self, injection: Injection) -> None:
        self.state.mark_fired(injection.fault, injection.to_dict())
        self._fired_in_subrun = self._fired_in_subrun or injection.injected
        self.on_inject(injection)

    def _shift_schedule(self, subrun: str, last_step: Optional[int]) -> None:
        self.state.mark_unscheduled(subrun)
        waiting = tuple(label for label, fault in self.schedule.runtime
                        if fault.at_subrun is not None and not self.state.has_fired(label))
        self.on_inject(ScheduleShift(subrun, last_step, self.clock(), self.state.shift, waiting))
