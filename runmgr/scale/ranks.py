"""What the driver sees of a data-parallel job's ranks, computed from a clock.

A sub-run's ranks step in lockstep (each step ends with a collective): step ``s``
starts when step ``s - 1`` ended, every rank beats ``step`` as it starts one, rank 0
reports each step (every rank's compute time in it) and each checkpoint. A straggler
makes every step from its fault on as long as its compute; a killed or hung rank
stops the job inside that step (its peers wait in the collective). Plain Python:
no Ray, no torch; :mod:`runmgr.scale.hosts` serves it to the driver.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from typing import Literal, Optional

from trainer.report import CheckpointReport, Heartbeat, StartReport, StepReport

FaultKind = Literal["kill", "hang", "slow"]

COMPUTE_SHARE = 0.9
"""The part of a step a rank spends computing (the rest: the collective)."""
JITTER = 0.02
"""Each rank's compute time varies by up to this fraction from step to step (deterministically)."""


@dataclass(frozen=True)
class RankFault:
    """A fault of one rank at the step a sub-run reaches first (once per lineage)."""

    kind: FaultKind
    """``kill``: its process dies in the step; ``hang``: it stops in the step, its peers wait;
    ``slow``: its compute takes ``factor`` times as long from the step on, to the sub-run's end."""
    rank: int
    at_step: int
    factor: float = 3.0
    """``slow``: how many times the others' compute time."""


@dataclass(frozen=True)
class JobScript:
    """The simulated job: its size, its pace and its faults."""

    world: int
    """Ranks."""
    step_s: float
    """Seconds of one step without a straggler."""
    save_interval: int
    """Steps between checkpoints (rank 0 reports each)."""
    init_s: float = 0.5
    """Seconds from a rank's start to its first step."""
    faults: tuple[RankFault, ...] = ()
    tokens_per_step: int = 4096 * 1024
    """Global tokens of one step (for the reports' throughput)."""


@dataclass
class SubrunSchedule:
    """When each step of one sub-run starts and ends, from its start time and the faults that
    are due in it (``faults``: the script's, less those an earlier sub-run met)."""

    script: JobScript
    subrun: str
    start_step: int
    final_step: int
    started_at: float
    faults: tuple[RankFault, ...]
    _starts: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        stops = [f.at_step for f in self.faults if f.kind in ("kill", "hang") and f.at_step > self.start_step]
        self.stall_step: Optional[int] = min(stops) if stops else None
        """The step no rank finishes (a kill or a hang in it), if the sub-run reaches it."""
        self._starts = [self.started_at + self.script.init_s]  # the start of step start_step + 1
        self._asked: tuple[float, int] = (float("-inf"), self.start_step)
        """The last :meth:`last_started` question and its answer."""

    def fault_at_stall(self) -> Optional[RankFault]:
        return next((f for f in self.faults if f.kind in ("kill", "hang") and f.at_step == self.stall_step), None)

    def met(self, now: float) -> tuple[RankFault, ...]:
        """The faults this sub-run has reached by ``now`` (their step started)."""
        return tuple(f for f in self.faults if f.at_step > self.start_step and self.last_started(now) >= f.at_step)

    def fault_time(self, fault: RankFault) -> float:
        """When ``fault`` happens in this sub-run: a kill halfway through its step, a hang or a
        straggler as its step starts."""
        start = self.start_of(fault.at_step)
        return start + self.duration(fault.at_step) / 2 if fault.kind == "kill" else start

    def factor(self, rank: int, step: int) -> float:
        """How many times a normal compute ``rank`` takes in ``step``."""
        slow = [f.factor for f in self.faults if f.kind == "slow" and f.rank == rank and step >= f.at_step]
        return max(slow, default=1.0)

    def compute_s(self, rank: int, step: int) -> float:
        wobble = (zlib.crc32(f"{rank}:{step}".encode()) % 2001 - 1000) / 1000 * JITTER
        return self.script.step_s * COMPUTE_SHARE * self.factor(rank, step) * (1 + wobble)

    def duration(self, step: int) -> float:
        slowest = max([self.factor(f.rank, step) for f in self.faults if f.kind == "slow"], default=1.0)
        return self.script.step_s * slowest

    def start_of(self, step: int) -> float:
        """When ``step`` starts (the step after ``start_step`` starts ``init_s`` after the sub-run)."""
        while len(self._starts) <= step - self.start_step - 1:
            done = self.start_step + len(self._starts)
            self._starts.append(self._starts[-1] + self.duration(done))
        return self._starts[step - self.start_step - 1]

    def end_of(self, step: int) -> float:
        return self.start_of(step + 1)

    def last_started(self, now: float) -> int:
        """The last step started by ``now`` (``start_step``: none yet), up to the stall or the end."""
        # Thousands of ranks ask about the same moments: go on from the last answer when it is earlier.
        since, step = self._asked if self._asked[0] <= now else (float("-inf"), self.start_step)
        limit = self.final_step if self.stall_step is None else min(self.final_step, self.stall_step)
        while step < limit and self.start_of(step + 1) <= now:
            step += 1
        self._asked = (now, step)
        return step

    def finished_at(self) -> Optional[float]:
        """When the last step ends (None: the sub-run stalls before it)."""
        if self.stall_step is not None and self.stall_step <= self.final_step:
            return None
        return self.end_of(self.final_step)


class RankView:
    """What one rank has said by a time, handed out once: :meth:`since` returns only what is new."""

    def __init__(self, schedule: SubrunSchedule, rank: int, rejoined: bool = False) -> None:
        """``rejoined``: the rank re-formed warm into ``schedule``'s sub-run (trainer/recovery/
        regroup.py): it beats its steps on, with no init beat and no start report."""
        self.schedule = schedule
        self.rank = rank
        # None: not even the init beat yet
        self._said_step: Optional[int] = schedule.start_step if rejoined else None
        self._reported_step = schedule.start_step

    def since(self, now: float) -> list[tuple[str, object]]:
        """The reports of this rank new since the last call, as ``(kind, report)``."""
        s = self.schedule
        out: list[tuple[str, object]] = []
        if self._said_step is None:
            if now < s.started_at:
                return out
            out.append(("heartbeat", Heartbeat(self.rank, "init", s.start_step, s.started_at)))
            if self.rank == 0:
                out.append(("started", self._start_report()))
            self._said_step = s.start_step
        started = s.last_started(now)
        for step in range(self._said_step + 1, started + 1):
            out.append(("heartbeat", Heartbeat(self.rank, "step", step, s.start_of(step))))
        self._said_step = max(self._said_step, started)
        if self.rank == 0:
            out += self._rank0_reports(now)
        return out

    def _rank0_reports(self, now: float) -> list[tuple[str, object]]:
        s, out = self.schedule, []
        while self._reported_step < s.final_step and s.end_of(self._reported_step + 1) <= now \
                and (s.stall_step is None or self._reported_step + 1 < s.stall_step):
            step = self._reported_step = self._reported_step + 1
            out.append(("step", self._step_report(step)))
            if step % s.script.save_interval == 0 or step == s.final_step:
                out.append(("checkpoint", CheckpointReport(s.subrun, step, f"sim://step/{step}", 0.1, s.end_of(step))))
        return out

    def _step_report(self, step: int) -> StepReport:
        s = self.schedule
        ended, took = s.end_of(step), s.duration(step)
        return StepReport(
            subrun=s.subrun, step=step, loss=2.0 + 3.0 * math.exp(-step / 300) + 0.01 * math.sin(step),
            grad_norm=1.0 + 0.05 * math.cos(step), lr=3.0e-4, loss_scale=1.0, tokens=s.script.tokens_per_step,
            consumed_samples=step * 1024, step_time=took,
            compute_times=tuple(s.compute_s(rank, step) for rank in range(s.script.world)),
            skipped=False, time=ended, tokens_per_s=s.script.tokens_per_step / took)

    def _start_report(self) -> StartReport:
        s = self.schedule
        return StartReport(subrun=s.subrun, start_step=s.start_step, resumed_from=None,
                           consumed_samples=s.start_step * 1024, optimizer=(), loss_scale=1.0, lr_scale=1.0,
                           clip_grad=1.0, reset_optimizer=False, skip_ranges=(), time=s.started_at,
                           layout=f"dp {s.script.world} x tp 1 x pp 1", data_parallel_size=s.script.world,
                           accumulation_steps=1)
