"""Worker groups over the simulated world, for the real controller.

:class:`SimulatedGroup` is today's restart path: every sub-run starts new
processes that load the newest disk checkpoint (``cold_restart_s``).
:class:`WarmSimulatedGroup` also keeps in-memory snapshots replicated to the
next node and ready spares, so the policy may decide a warm restart
(``warm_restart_s``, from the newest snapshot). A poll returns at once when a
failure happens (as ``ray.wait`` does), ``detect_s`` later.
"""

from __future__ import annotations

from typing import Optional

from runmgr.controller.group import GroupPoll, WarmStart, WorkerFailure, WorkerInfo
from runmgr.policy.warm import WarmCover
from runmgr.simulate.failures import Failure
from runmgr.simulate.world import SimWorld
from trainer.config import TrainerConfig
from trainer.plan import ResumePlan
from trainer.report import CheckpointReport, StepReport

CHECKPOINT_PREFIX = "sim://step/"
"""How a simulated checkpoint is named in a plan (the step follows)."""


def checkpoint_path(step: int) -> str:
    return f"{CHECKPOINT_PREFIX}{step}"


def step_of_path(path: Optional[str]) -> int:
    return int(path[len(CHECKPOINT_PREFIX):]) if path else 0


class SimulatedGroup:
    """The ranks of one sub-run in the simulated world (the cold path)."""

    def __init__(self, world: SimWorld, every_step: bool = False) -> None:
        """``every_step``: report each step, as a run's rank 0 does (for a logbook of the run);
        otherwise only the last one of each poll (enough for the controller)."""
        self.world = world
        self.every_step = every_step
        self.subrun = ""
        self.failed_at_step = 0
        """The last step completed when this group's failure stopped it."""
        self._last_reported: Optional[int] = None
        self._last_step = 0
        """The last step reported."""

    def start(self, config: TrainerConfig, plan: ResumePlan) -> list[WorkerInfo]:
        world = self.world
        world.clock.sleep(world.a.cold_restart_s)
        world.ledger.cold_restarts += world.a.cold_restart_s
        world.ledger.cold_count += 1
        return self._resume(plan, step_of_path(plan.start_checkpoint))

    def _resume(self, plan: ResumePlan, step: int) -> list[WorkerInfo]:
        world = self.world
        world.replace_nodes(plan.avoid_nodes)
        world.start_segment(step)
        self.subrun, self._last_reported = plan.subrun, world.saved_step
        self._last_step = step
        return list(world.workers())

    def poll(self, timeout_s: float) -> GroupPoll:
        world = self.world
        if world.segment is None:  # ended by a failure: nothing more comes
            return GroupPoll()
        start = world.clock.now
        failure = world.failures[0] if world.failures else None
        finish = world.completed_at(world.train_steps)
        end = min(start + timeout_s, finish)
        if failure is not None and failure.time <= end:
            return self._fail(world.failures.popleft(), max(failure.time, start))
        world.clock.now = end
        poll = self._progress(end)
        if end >= finish:
            world.end_segment(end)
            poll.finished_ranks = list(range(world.a.devices))
        return poll

    def _progress(self, at: float) -> GroupPoll:
        """What the ranks reported up to ``at``: the last step and a new checkpoint."""
        world, poll = self.world, GroupPoll()
        done = min(world.steps_done(at), world.train_steps)
        if self.every_step:  # each step once, as rank 0 reports it (never the sub-run's start step)
            poll.steps = [self._step_report(step, world.completed_at(step))
                          for step in range(self._last_step + 1, done + 1)]
        else:
            poll.steps = [self._step_report(done, at)]
        self._last_step = max(self._last_step, done)
        saved = world.newest_save(at)
        if saved is not None and saved != self._last_reported:
            self._last_reported = saved
            poll.checkpoints = [CheckpointReport(self.subrun, saved, checkpoint_path(saved), 0.0, at)]
        return poll

    def _step_report(self, step: int, at: float) -> StepReport:
        return StepReport(self.subrun, step, 2.0, 1.0, 1e-4, 1.0, 0, 0, self.world.step_time_s, (), False, at)

    def _fail(self, failure: Failure, at: float) -> GroupPoll:
        world = self.world
        poll = self._progress(at)
        done = world.end_segment(at)
        world.ledger.failures += 1
        world.clock.now = at + world.a.detect_s
        world.ledger.detection += world.a.detect_s
        rank, node = failure.device, world.node_of(failure.device)
        kind = "died" if failure.cls.scope == "node" else "error"
        poll.failures = [WorkerFailure(rank, kind, failure.cls.text.format(node=node), self.world.workers()[rank], at)]
        self.failed_at_step = done
        return poll

    def shutdown(self) -> None:
        if self.world.segment is not None:  # stopped while training (an abort): account its time
            self.world.end_segment(self.world.clock.now)


class WarmSimulatedGroup(SimulatedGroup):
    """The warm path: snapshots in memory every ``snapshot_interval_steps``, each also on the
    next node's memory (its data-parallel peer), and ``warm_spares`` ready processes."""

    def __init__(self, world: SimWorld, every_step: bool = False) -> None:
        super().__init__(world, every_step)
        self._cover: Optional[WarmCover] = None

    def warm_cover(self) -> WarmCover:
        world = self.world
        interval = world.a.snapshot_interval_steps
        done = world.steps_done(world.clock.now) if world.segment is not None else self.failed_at_step
        rank_nodes, holders = self._placement()
        return WarmCover((done // interval) * interval, rank_nodes, holders, {"spares": world.ready_spares()})

    def _placement(self) -> tuple[dict[int, str], dict[int, tuple[str, str]]]:
        """Each rank's node, and the nodes holding its snapshot (its own and the next one),
        updated for the nodes replaced since the last call (16,384 ranks: not rebuilt)."""
        nodes, per_node = self.world.node_names, self.world.a.devices_per_node
        if self._cover is None:
            self._cover = WarmCover(None, {}, {})
            changed = range(len(nodes))
        else:
            changed = [i for i, name in enumerate(nodes) if self._cover.rank_nodes[i * per_node] != name]
        rank_nodes, holders = self._cover.rank_nodes, self._cover.holders
        assert isinstance(rank_nodes, dict) and isinstance(holders, dict)
        for index in {i for c in changed for i in (c, c - 1)}:  # a node's ranks, and its buddy's copies
            index %= len(nodes)
            for rank in range(index * per_node, (index + 1) * per_node):
                rank_nodes[rank] = nodes[index]
                holders[rank] = (nodes[index], nodes[(index + 1) % len(nodes)])
        return rank_nodes, holders

    def recover(self, config: TrainerConfig, plan: ResumePlan, warm: WarmStart) -> list[WorkerInfo]:
        world = self.world
        world.take_spares(len(warm.ranks))
        world.clock.sleep(world.a.warm_restart_s)
        world.ledger.warm_restarts += world.a.warm_restart_s
        world.ledger.warm_count += 1
        return self._resume(plan, warm.step)
