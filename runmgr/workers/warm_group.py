"""A Ray worker group that keeps warm state: ready spares and the ranks' memory snapshots.

Besides one actor per rank (:class:`runmgr.workers.group.RayWorkerGroup`), it
starts ``controller.warm_spares`` spare actors, each with the model built and
the optimizer's first-step imports paid, waiting (trainer/loop.py's
``train_spare``; runmgr/workers/spares.py counts one ready only then). Every
rank trains with a warm link. In plain data parallel each replica's live state
holds the whole state, committed at the step before the one it begins: any
survivor is a donor and no snapshot is taken (trainer/live.py). Under the other
layouts each rank keeps an in-memory snapshot every
``checkpoint.memory_interval`` steps (sharded
state, tensor and pipeline parallel) each rank's buddy keeps a copy of its
snapshot: the buddy sits on another node where there is one
(:func:`runmgr.policy.warm.buddy_offset`), and it is the donor.

When the policy decides a warm restart, :meth:`recover` gives each lost rank a
spare, a new rendezvous (a fresh port on rank 0's node) and its donor, and
answers the survivors, who wait in their warm link: the group re-forms in the
same processes and training goes on from the newest state every survivor
holds (in plain data parallel: the newest any survivor holds). What cannot be done warm raises :class:`WarmRecoveryError`; the
controller then stops the group and the policy restarts cold. Once the
re-formed group has stepped, a new spare starts in each slot a lost rank left
(unless the plan avoids its node): a second fault is recovered warm too.

A whole node lost is named as soon as its ranks' peers wait in their warm link
and its raylet is gone (runmgr/workers/liveness.py), not when Ray declares the
node dead seconds later.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

from runmgr import cluster as ray_cluster
from runmgr.agents.snapshots import SnapshotLedger
from runmgr.controller.group import GroupPoll, SpareEvent, WarmRecoveryError, WarmStart, WorkerInfo
from runmgr.nodes import node_name
from runmgr.policy.warm import WarmCover
from runmgr.workers.group import RayWorkerGroup
from runmgr.workers.liveness import PeerProbe
from runmgr.workers.spares import SPARE_RANK, Slot, SparePool
from runmgr.workers.warm_rules import SURVIVOR_WAIT_S, WARM_SETTLE_S, donor_of, slot_not_refilled, survivors_not_waiting
from trainer.config import TrainerConfig
from trainer.distributed import DistEnv
from trainer.plan import ResumePlan
from trainer.warm import Rejoin, snapshot_holders

@dataclass
class Refill:
    """Slots a warm restart freed, to hold new spares once the re-formed group has stepped past
    ``after_step`` (a spare that starts earlier would take CPU from the recovery)."""

    after_step: int
    slots: list[Slot]
    ranks: list[int]




class WarmRayWorkerGroup:
    """The ranks (a :class:`RayWorkerGroup` it holds) plus ready spares; recovers a lost rank in
    place and replaces the spare. It changes the ranks only through their group's
    ``replace`` and ``kill``."""

    def __init__(self, ranks: RayWorkerGroup, probe: PeerProbe, warm_spares: int) -> None:
        """``ranks`` must have been made with ``probe`` as its ``lost_ranks`` (:func:`warm_group`)."""
        self.ranks = ranks
        self.warm_spares = warm_spares
        self._probe = probe
        self._pool = SparePool(warm_spares, lambda strategy: ranks.create_actor(strategy, SPARE_RANK),
                               self._run_spare, ranks.start_timeout_s)
        self._snapshots = SnapshotLedger()
        self._buddy_offset = 1
        self._refill: Optional[Refill] = None
        self._events: list[SpareEvent] = []
        """Spare events of the last recovery, for the next poll."""

    @property
    def workers(self) -> list[WorkerInfo]:
        return self.ranks.workers

    def start(self, config: TrainerConfig, plan: ResumePlan) -> list[WorkerInfo]:
        self._config, self._plan = config, plan
        workers = self.ranks.start(config, plan, extra=self.warm_spares, warm=True)
        # A replica's live state serves in plain data parallel (trainer/live.py).
        self._snapshots = SnapshotLedger(live=config.layout(self.ranks.world_size).plain)
        self._buddy_offset = self.ranks.buddy_offset  # the ranks' buddies, as they started: replacements keep them
        strategies = self.ranks.extra_strategies
        actors, infos = self.ranks.spawn(strategies, [SPARE_RANK] * len(strategies), "warm spares")
        self._pool.add_started(actors, list(strategies), infos)
        return workers

    def _run_spare(self, actor):
        """Start ``actor`` training as a spare: it builds the model, then waits to be named."""
        return actor.run_spare.remote(self._config, self._plan, self.ranks.wrap_reporter, self._buddy_offset)

    def poll(self, timeout_s: float) -> GroupPoll:
        poll = self.ranks.poll(timeout_s)
        for beat in poll.heartbeats:
            self._snapshots.beat(beat)
        if poll.steps:  # rank 0 reports a step it committed
            self._snapshots.committed(poll.steps[-1].step)
        events, self._events = self._events, []
        if self._refill is not None and any(report.step > self._refill.after_step for report in poll.steps):
            refill, self._refill = self._refill, None
            events += self._pool.refill(refill.slots, refill.ranks)
        poll.spare_events += events + self._pool.poll()
        poll.ready_spares = len(self._pool.ready())
        return poll

    def warm_cover(self) -> WarmCover:
        nodes = {info.rank: node_name(info.node_id) for info in self.ranks.workers}
        holders = {rank: tuple(dict.fromkeys(nodes[holder] for holder in self._holders(rank))) for rank in nodes}
        spares: dict[str, int] = {}
        for spare in self._pool.ready():
            spares[node_name(spare.info.node_id)] = spares.get(node_name(spare.info.node_id), 0) + 1
        steps = [self._snapshots.step_of(rank) for rank in nodes]
        known = [step for step in steps if step is not None]
        return WarmCover(max(known) if known else None, nodes, holders, spares)

    def _holders(self, rank: int) -> tuple[int, ...]:
        """The ranks whose memory holds ``rank``'s snapshot: every replica in plain data parallel,
        else ``rank`` and its buddy (trainer/warm.py)."""
        return snapshot_holders(rank, self._config.layout(self.ranks.world_size), self._buddy_offset)

    def recover(self, config: TrainerConfig, plan: ResumePlan, warm: WarmStart) -> list[WorkerInfo]:
        lost = sorted(set(warm.ranks))
        survivors = [rank for rank in range(self.ranks.world_size) if rank not in lost]
        spares = self._pool.usable(warm.avoid_nodes)[:len(lost)]
        if len(spares) < len(lost) or not survivors:
            raise WarmRecoveryError(f"{len(spares)} ready spare(s) off the avoided nodes for {len(lost)} lost rank(s)")
        donors = {rank: self._donor(rank, set(lost)) for rank in lost}
        for rank in lost:  # a rank on an excluded node may still live
            self.ranks.kill(rank)
        self._wait_for_survivors(survivors)
        self._pool.take(spares)
        workers = self.ranks.workers
        freed = [Slot(self.ranks.strategy(rank), workers[rank].node_id) for rank in lost]
        for rank, spare in zip(lost, spares):
            info = WorkerInfo(rank, spare.info.pid, spare.info.node_id, spare.info.node_ip)
            self.ranks.replace(rank, spare.actor, spare.strategy, info, spare.run)
        self._answer(plan, warm, donors)
        self._plan_refill(warm, lost, freed)
        self._probe.reset()
        self._snapshots.clear()
        return self.workers

    def _donor(self, rank: int, lost: set[int]) -> int:
        """A survivor that holds ``rank``'s snapshot."""
        return donor_of(rank, self._holders(rank), lost)

    def _answer(self, plan: ResumePlan, warm: WarmStart, donors: dict[int, int]) -> None:
        """Tell every rank where the group re-forms: a fresh port on rank 0's node, each replaced
        rank's donor, never past ``warm.step``."""
        port = ray_cluster.get_while_head_lives([self.ranks.actor(0).reserve_port.remote()],
                                                self.ranks.start_timeout_s)[0]
        master, world = self.ranks.workers[0].node_ip, self.ranks.world_size
        for rank in range(world):
            self.ranks.actor(rank).answer.remote(Rejoin(DistEnv(rank, world, 0, master, port), plan, donors, warm.step))

    def _plan_refill(self, warm: WarmStart, lost: list[int], freed: list[Slot]) -> None:
        """New spares for the slots the lost ranks left, once the group has stepped; a slot on a
        node the plan avoids is not used (fewer spares: a further fault restarts cold)."""
        usable = [slot for slot in freed if node_name(slot.node_id) not in warm.avoid_nodes]
        for rank, slot in zip(lost, freed):
            if slot not in usable:
                self._events.append(self._pool.not_refilled(slot_not_refilled(rank, node_name(slot.node_id))))
        if usable:
            self._refill = Refill(warm.step, usable, [rank for rank, slot in zip(lost, freed) if slot in usable])

    def _wait_for_survivors(self, survivors: list[int]) -> None:
        """Until every survivor waits in its warm link (its collective failed): answering one
        still inside a collective would leave it in the old group."""
        deadline = time.monotonic() + SURVIVOR_WAIT_S
        pending = set(survivors)
        while pending:
            answers = ray_cluster.get_while_head_lives([self.ranks.actor(r).waiting.remote() for r in sorted(pending)],
                                                       self.ranks.start_timeout_s)
            pending = {rank for rank, waiting in zip(sorted(pending), answers) if not waiting}
            if pending and time.monotonic() > deadline:
                raise survivors_not_waiting(pending, SURVIVOR_WAIT_S)
            if pending:
                time.sleep(0.005)

    def shutdown(self) -> None:
        self._pool.shutdown()
        self._refill = None
        self.ranks.shutdown()


def warm_group(*args, warm_spares: int, **kwargs) -> WarmRayWorkerGroup:
    """A warm group over a :class:`RayWorkerGroup` of ``args`` and ``kwargs`` whose lost ranks its
    liveness probe names."""
    probe = PeerProbe()
    ranks = RayWorkerGroup(*args, lost_ranks=probe, settle_s=WARM_SETTLE_S, **kwargs)
    return WarmRayWorkerGroup(ranks, probe, warm_spares)
