"""The simulated cluster under the real controller: a clock, the training's
progress in steps, the disk checkpoints, the nodes, the ready spares, and a
ledger of where the time went. Plain arithmetic; nothing sleeps.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Optional

from runmgr.controller.group import WorkerInfo
from runmgr.simulate.assumptions import EttrAssumptions
from runmgr.simulate.failures import Failure


class SimClock:
    """Simulated seconds since the run started; the controller's ``clock`` and ``sleep``."""

    def __init__(self) -> None:
        self.now = 0.0

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)


@dataclass
class Ledger:
    """Where the wall time went, in seconds (the lost work is what is left)."""

    checkpoint_stalls: float = 0.0
    detection: float = 0.0
    cold_restarts: float = 0.0
    warm_restarts: float = 0.0
    waits: float = 0.0
    """Waits a decision asked for (a launch retried after ``wait_s``)."""
    failures: int = 0
    cold_count: int = 0
    warm_count: int = 0
    steps_redone: int = 0
    """Steps trained again after a restart (the steps each restart lost)."""


@dataclass
class Segment:
    """Training since the last (re)start: from ``start_step`` at ``start_time``."""

    start_step: int
    start_time: float


class SimWorld:
    """What outlives a sub-run: time, steps, checkpoints, nodes, spares, failures to come."""

    def __init__(self, assumptions: EttrAssumptions, failures: list[Failure], step_time_s: float) -> None:
        """``step_time_s``: a step's wall time on this path (the warm path's snapshots included)."""
        self.a = assumptions
        self.step_time_s = step_time_s
        self.train_steps = assumptions.train_steps
        self.clock = SimClock()
        self.failures = deque(failures)
        self.ledger = Ledger()
        self.saved_step: Optional[int] = None
        """The newest disk checkpoint whose save finished."""
        self.segment: Optional[Segment] = None
        self.last_done = 0
        """The last step completed when training last stopped."""
        self.node_names = [f"n{i:05d}" for i in range(assumptions.devices // assumptions.devices_per_node)]
        self._generation = [0] * len(self.node_names)
        self._workers = [WorkerInfo(rank, 1000 + rank, self.node_of(rank), "10.0.0.1")
                         for rank in range(assumptions.devices)]
        self.spares_ready = assumptions.warm_spares
        self._refills: deque[float] = deque()
        """When each used spare is ready again, oldest first."""

    # -- training progress -------------------------------------------------------------
    def completed_at(self, step: int) -> float:
        """When ``step`` completes in the current segment (checkpoint stalls included)."""
        seg, a = self._segment(), self.a
        saves_before = (step - 1) // a.checkpoint_interval_steps - seg.start_step // a.checkpoint_interval_steps
        return seg.start_time + (step - seg.start_step) * self.step_time_s + max(0, saves_before) * a.checkpoint_stall_s

    def steps_done(self, at: float) -> int:
        """The last step completed by time ``at`` (the segment's start step at least)."""
        seg = self._segment()
        low, high = seg.start_step, seg.start_step + int((at - seg.start_time) / self.step_time_s) + 1
        while low < high:  # the largest step completed by ``at``
            middle = (low + high + 1) // 2
            if self.completed_at(middle) <= at:
                low = middle
            else:
                high = middle - 1
        return low

    def newest_save(self, at: float) -> Optional[int]:
        """The newest disk checkpoint whose save finished by ``at``."""
        seg, interval = self._segment(), self.a.checkpoint_interval_steps
        done = min(self.steps_done(at), self.train_steps)
        for step in ((done // interval) * interval, (done // interval - 1) * interval):
            if step > seg.start_step and self.completed_at(step) + self.a.checkpoint_stall_s <= at:
                return step
        return self.saved_step

    def stall_time(self, until: float) -> float:
        """Seconds of checkpoint stalls in the current segment up to ``until``."""
        seg, interval, stall = self._segment(), self.a.checkpoint_interval_steps, self.a.checkpoint_stall_s
        done = self.steps_done(until)
        saves = done // interval - seg.start_step // interval
        partial = 0.0
        if saves > 0 and done % interval == 0:  # inside the last save's stall, or past it
            partial = min(stall, until - self.completed_at(done))
            saves -= 1
        return saves * stall + partial

    def start_segment(self, step: int) -> None:
        self.ledger.steps_redone += max(0, self.last_done - step)
        self.segment = Segment(step, self.clock.now)

    def end_segment(self, at: float) -> int:
        """Stop training at ``at``: account its stalls and saves; the last step completed."""
        done = min(self.steps_done(at), self.train_steps)
        self.ledger.checkpoint_stalls += self.stall_time(at)
        self.saved_step = self.newest_save(at)
        self.segment, self.last_done = None, done
        return done

    def _segment(self) -> Segment:
        if self.segment is None:
            raise RuntimeError("no training segment is running")
        return self.segment

    # -- nodes and spares --------------------------------------------------------------
    def node_of(self, rank: int) -> str:
        return self.node_names[rank // self.a.devices_per_node]

    def workers(self) -> list[WorkerInfo]:
        """Every rank where it runs now (kept between sub-runs: 16,384 of them)."""
        per_node = self.a.devices_per_node
        for index, name in enumerate(self.node_names):
            if self._workers[index * per_node].node_id != name:
                for rank in range(index * per_node, (index + 1) * per_node):
                    self._workers[rank] = WorkerInfo(rank, 1000 + rank, name, "10.0.0.1")
        return self._workers

    def replace_nodes(self, avoid: tuple[str, ...]) -> None:
        """Every node the plan avoids is swapped for a repaired or spare one (a new name):
        the fleet keeps hot spares, as Llama 3's did."""
        avoided = set(avoid)
        for index, name in enumerate(self.node_names):
            if name in avoided:
                self._generation[index] += 1
                self.node_names[index] = f"n{index:05d}g{self._generation[index]}"

    def ready_spares(self) -> int:
        while self._refills and self._refills[0] <= self.clock.now:
            self._refills.popleft()
            self.spares_ready += 1
        return self.spares_ready

    def take_spares(self, count: int) -> None:
        self.spares_ready -= count
        self._refills.extend([self.clock.now + self.a.spare_refill_s] * count)
