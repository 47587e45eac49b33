"""A Ray worker group that keeps warm state: ready spares and the ranks' memory snapshots.

Besides one actor per rank (:class:`runmgr.workers.group.RayWorkerGroup`), it
starts ``controller.warm_spares`` spare actors, each with the model built and
the optimizer's first-step imports paid, waiting (trainer/loop.py's
``train_spare``). Every rank trains with a warm link and keeps an in-memory
snapshot every ``checkpoint.memory_interval`` steps; in plain data parallel
each replica holds the whole state, so any survivor is a donor. Under the
other layouts (sharded state, tensor and pipeline parallel) each rank's
buddy keeps a copy of its snapshot: the buddy sits on another node where
there is one (:func:`runmgr.policy.warm.buddy_offset`), and it is the donor.

When the policy decides a warm restart, :meth:`recover` gives each lost rank a
spare, a new rendezvous (a fresh port on rank 0's node) and its donor, and
answers the survivors, who wait in their warm link: the group re-forms in the
same processes and training goes on from the newest snapshot every survivor
holds. What cannot be done warm raises :class:`WarmRecoveryError`; the
controller then stops the group and the policy restarts cold.
"""

from __future__ import annotations

import time

import ray

from runmgr import cluster as ray_cluster
from runmgr.controller.group import GroupPoll, WarmRecoveryError, WarmStart, WorkerInfo
from runmgr.controller.judge import node_name
from runmgr.policy.warm import WarmCover
from runmgr.workers.group import RayWorkerGroup
from trainer.config import TrainerConfig
from trainer.distributed import DistEnv
from trainer.plan import ResumePlan
from trainer.warm import Rejoin, snapshot_holders

SURVIVOR_WAIT_S = 10.0
"""How long a recovery waits for the survivors to be waiting in their warm link (a
survivor's collective fails within ~0.05 s of a peer's death on gloo)."""


class WarmRayWorkerGroup(RayWorkerGroup):
    """One actor per rank plus ready spares; recovers a lost rank in place."""

    def __init__(self, *args, warm_spares: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.warm_spares = warm_spares
        self._spares: list = []
        self._spare_infos: list[WorkerInfo] = []
        self._spare_runs: dict = {}
        self._snapshots: dict[int, int] = {}
        self._buddy_offset = 1
        self.settle_s = 0.1  # survivors do not echo a warm group's deaths: no wait for the root cause

    def start(self, config: TrainerConfig, plan: ResumePlan) -> list[WorkerInfo]:
        self._config, self._plan = config, plan
        workers = self._start_ranks(config, plan, extra=self.warm_spares, warm=True)
        self._buddy_offset = self.buddy_offset  # the ranks' buddies, as they started: replacements keep them
        self._start_spares(config, plan)
        return workers

    def _start_spares(self, config: TrainerConfig, plan: ResumePlan) -> None:
        self._spares, self._spare_infos = self._spawn(self._extra_strategies, [-1] * len(self._extra_strategies),
                                                      "warm spares")
        self._spare_runs = {s.run_spare.remote(config, plan, self.wrap_reporter, self.buddy_offset): index
                            for index, s in enumerate(self._spares)}

    def poll(self, timeout_s: float) -> GroupPoll:
        poll = super().poll(timeout_s)
        for beat in poll.heartbeats:
            if beat.phase == "snapshot":
                self._snapshots[beat.rank] = max(beat.step, self._snapshots.get(beat.rank, -1))
        return poll

    def warm_cover(self) -> WarmCover:
        nodes = {info.rank: node_name(info.node_id) for info in self._infos}
        holders = {rank: tuple(dict.fromkeys(nodes[holder] for holder in self._holders(rank))) for rank in nodes}
        spares: dict[str, int] = {}
        for info in self._ready_spares():
            spares[node_name(info.node_id)] = spares.get(node_name(info.node_id), 0) + 1
        steps = [self._snapshots.get(rank) for rank in nodes]
        known = [step for step in steps if step is not None]
        return WarmCover(max(known) if known else None, nodes, holders, spares)

    def _holders(self, rank: int) -> tuple[int, ...]:
        """The ranks whose memory holds ``rank``'s snapshot: every replica in plain data parallel,
        else ``rank`` and its buddy (trainer/warm.py)."""
        return snapshot_holders(rank, self._config.layout(self._world), self._buddy_offset)

    def _ready_spares(self) -> list[WorkerInfo]:
        return [self._spare_infos[index] for ref, index in self._spare_runs.items()
                if self._spares[index] is not None]

    def recover(self, config: TrainerConfig, plan: ResumePlan, warm: WarmStart) -> list[WorkerInfo]:
        lost = set(warm.ranks)
        survivors = [rank for rank in range(self._world) if rank not in lost]
        spares = [index for index, info in enumerate(self._spare_infos)
                  if self._spares[index] is not None and node_name(info.node_id) not in warm.avoid_nodes]
        if len(spares) < len(lost) or not survivors:
            raise WarmRecoveryError(f"{len(spares)} usable spare(s) for {len(lost)} lost rank(s)")
        donors = {rank: self._donor(rank, lost) for rank in lost}
        for rank in lost:  # a rank on an excluded node may still live
            ray.kill(self._actors[rank], no_restart=True)
        self._wait_for_survivors(survivors)
        taken = dict(zip(sorted(lost), spares))
        for rank, index in taken.items():
            self._actors[rank], self._infos[rank] = self._spares[index], self._spare_infos[index]
            self._spares[index] = None
        master_actor = self._actors[0]
        port = ray_cluster.get_while_head_lives([master_actor.reserve_port.remote()], self.start_timeout_s)[0]
        master = self._infos[0].node_ip
        for rank, actor in enumerate(self._actors):
            actor.answer.remote(Rejoin(DistEnv(rank, self._world, 0, master, port), plan, donors, warm.step))
        for rank, index in taken.items():
            self._runs = {ref: r for ref, r in self._runs.items() if r != rank}
            ref = next(ref for ref, i in self._spare_runs.items() if i == index)
            del self._spare_runs[ref]
            self._runs[ref] = rank
            self._infos[rank] = WorkerInfo(rank, self._infos[rank].pid, self._infos[rank].node_id,
                                           self._infos[rank].node_ip)
        for rank in lost:
            self._drains.pop(rank, None)
        self._snapshots = {}
        return self.workers

    def _donor(self, rank: int, lost: set[int]) -> int:
        """A survivor that holds ``rank``'s snapshot."""
        for holder in self._holders(rank):
            if holder not in lost:
                return holder
        raise WarmRecoveryError(f"no surviving rank holds rank {rank}'s memory snapshot")

    def _wait_for_survivors(self, survivors: list[int]) -> None:
        """Until every survivor waits in its warm link (its collective failed): answering one
        still inside a collective would leave it in the old group."""
        deadline = time.monotonic() + SURVIVOR_WAIT_S
        pending = set(survivors)
        while pending:
            answers = ray_cluster.get_while_head_lives([self._actors[r].waiting.remote() for r in sorted(pending)],
                                                       self.start_timeout_s)
            pending = {rank for rank, waiting in zip(sorted(pending), answers) if not waiting}
            if pending and time.monotonic() > deadline:
                raise WarmRecoveryError(f"rank(s) {sorted(pending)} did not notice the lost peer within "
                                        f"{SURVIVOR_WAIT_S:.0f} s")
            if pending:
                time.sleep(0.005)

    def shutdown(self) -> None:
        for spare in self._spares:
            if spare is not None:
                ray.kill(spare, no_restart=True)
        self._spares, self._spare_runs = [], {}
        super().shutdown()

