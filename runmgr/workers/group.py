"""The ranks of one sub-run as Ray actors, placed as the sub-run's plan says.

The controller talks to a :class:`runmgr.controller.group.WorkerGroup` only;
tests use a fake one. This group carries the plan out (its data-parallel
size, the nodes it avoids) and never decides anything itself: when the
cluster cannot hold the plan it raises :class:`ClusterError`, and the policy
decides (retry, resize, or a human).

The per-rank design, cold restarts only: a launch runs its ranks under node agents
(runmgr/workers/agent_group.py, warm spares included); the benches and the scale harness run
this beside them (bench/launch_cpu.py, bench/scale.py).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Optional, Protocol

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from runmgr import cluster as ray_cluster
from runmgr.config.schema import ClusterConfig
from runmgr.controller.group import GroupPoll, WorkerFailure, WorkerInfo
from runmgr.errors import ClusterError
from runmgr.placement import actor_resources, bundle_for
from runmgr.workers.actor import RemoteTrainerWorker, WrapReporter
from runmgr.workers.lease import DriverIdentity
from runmgr.workers.placing import node_slots, place, release
from trainer.config import TrainerConfig
from trainer.plan import ResumePlan

__all__ = ["RayWorkerGroup", "node_slots"]  # node_slots: launch imports it from here

# After the first failure, how long to wait for the others to surface so that
# the root cause (a dead process) wins over its echo (a peer's broken socket).
FAILURE_SETTLE_S = 1.0
# How long one poll waits for the ranks' buffered reports.
DRAIN_WAIT_S = 0.5


class RankActors(Protocol):
    """Where a group's rank actors come from and go: one Ray actor process per rank
    (:class:`RayRankActors`), or the scale harness's simulated ranks, many to a process
    (runmgr/scale/hosts.py)."""

    def place(self, count: int, what: str, avoid_nodes: Sequence[str]) -> tuple[object, list]:
        """Room for ``count`` actors (``what``, for the error): a handle for :meth:`release` and
        where each actor goes; a :class:`ClusterError` when the cluster cannot hold them."""

    def create(self, strategy, rank: int, world: int, driver: DriverIdentity):
        """The actor of ``rank`` of ``world``, placed by ``strategy``; it starts in the background."""

    def kill(self, actor) -> None:
        """End ``actor`` now."""

    def release(self, placement: object) -> None:
        """Give back the room :meth:`place` took."""


class RayRankActors:
    """One Ray actor process per rank running the trainer, in a placement group of the
    cluster's bundles (on the admitted nodes, off the plan's nodes to avoid)."""

    def __init__(self, cluster: ClusterConfig, device_kind: str, start_timeout_s: float, lease_s: float,
                 admitted_node_ids: Optional[list[str]]) -> None:
        self.cluster = cluster
        self.device_kind = device_kind
        self.start_timeout_s = start_timeout_s
        self.lease_s = lease_s
        self.admitted_node_ids = admitted_node_ids

    def place(self, count: int, what: str, avoid_nodes: Sequence[str]) -> tuple[object, list]:
        bundle = bundle_for(self.device_kind, self.cluster.cpus_per_worker, self.cluster.devices_per_worker)
        return place(bundle, count, what, self.cluster.placement_strategy, self.start_timeout_s,
                     self.admitted_node_ids, avoid_nodes)

    def create(self, strategy, rank: int, world: int, driver: DriverIdentity):
        resources = actor_resources(self.device_kind, self.cluster.cpus_per_worker, self.cluster.devices_per_worker)
        return RemoteTrainerWorker.options(**resources, scheduling_strategy=strategy).remote(
            rank, world, self.lease_s, driver)

    def kill(self, actor) -> None:
        ray.kill(actor, no_restart=True)

    def release(self, placement: object) -> None:
        release(placement)


class RayWorkerGroup:
    """One actor per rank, placed as the plan says."""

    def __init__(self, cluster: ClusterConfig, device_kind: str, start_timeout_s: float, lease_s: float,
                 admitted_node_ids: Optional[list[str]] = None, wrap_reporter: WrapReporter | None = None,
                 settle_s: float = FAILURE_SETTLE_S, rank_actors: RankActors | None = None) -> None:
        """``admitted_node_ids``: the nodes the health check admitted (None: it did not
        run, every alive node may be used). ``wrap_reporter``: what every rank's
        reports pass through (chaos's pauses). ``settle_s``: how long, after a
        first failure, the others are given to surface. ``rank_actors``: where the ranks'
        actors come from (None: one trainer process per rank, :class:`RayRankActors`)."""
        self.rank_actors = rank_actors or RayRankActors(cluster, device_kind, start_timeout_s, lease_s,
                                                        admitted_node_ids)
        self.wrap_reporter = wrap_reporter
        self.cluster = cluster
        self.lease_s = lease_s
        self.admitted_node_ids = admitted_node_ids
        self.device_kind = device_kind
        self.start_timeout_s = start_timeout_s
        self._driver = DriverIdentity.of_this_process()  # so that a worker tells a silent driver from a dead one
        self._pg = None
        self._actors: list = []
        self._infos: list[WorkerInfo] = []
        self._runs: dict = {}
        self._drains: dict = {}
        self._dead: set[int] = set()
        """Ranks whose actor is gone: nothing more to drain (a lost node's would never answer)."""
        self._world = 0
        self.settle_s = settle_s

    @property
    def workers(self) -> list[WorkerInfo]:
        return list(self._infos)

    @property
    def world_size(self) -> int:
        return self._world

    def start(self, config: TrainerConfig, plan: ResumePlan) -> list[WorkerInfo]:
        """Place the ranks and start training."""
        ray_cluster.check_head()  # placing ranks needs the head: without it Ray waits until it ends the driver
        world = config.world_size_of(plan.data_parallel_size) if plan.data_parallel_size else self.cluster.num_workers
        self._world = world
        self._pg, strategies = self.rank_actors.place(world, "workers", plan.avoid_nodes)
        self._actors, self._infos = self.spawn(strategies, list(range(world)), "workers")
        port = ray.get(self._actors[0].reserve_port.remote())
        master = self._infos[0].node_ip
        self._runs = {a.run.remote(config, plan, master, port, self.wrap_reporter): rank
                      for rank, a in enumerate(self._actors)}
        return self.workers

    def spawn(self, strategies: Sequence, ranks: list[int], what: str) -> tuple[list, list[WorkerInfo]]:
        """One actor per strategy (as ``ranks``), and where each runs; a :class:`ClusterError`
        when they do not start in time."""
        actors = [self.create_actor(strategy, rank) for rank, strategy in zip(ranks, strategies)]
        try:
            infos = ray_cluster.get_while_head_lives([a.describe.remote() for a in actors], self.start_timeout_s)
        except GetTimeoutError:
            for actor in actors:
                self.rank_actors.kill(actor)
            self.shutdown()
            raise ClusterError(f"{len(actors)} {what} did not start within {self.start_timeout_s:.0f} s "
                               f"(free resources: {ray.available_resources()})") from None
        return actors, infos

    def create_actor(self, strategy, rank: int):
        """A rank's actor placed by ``strategy``; it starts in the background."""
        return self.rank_actors.create(strategy, rank, self._world, self._driver)

    def kill(self, rank: int) -> None:
        """End ``rank``'s actor now."""
        self.rank_actors.kill(self._actors[rank])

    def poll(self, timeout_s: float) -> GroupPoll:
        result = GroupPoll()
        pending = list(self._runs)
        done, _ = ray.wait(pending, num_returns=len(pending), timeout=timeout_s) if pending else ([], [])
        self._collect_outcomes(done, result)
        if result.failures:
            self._settle_failures(result)
        if self._runs:  # ranks still training need the cluster; ranks that all returned are judged as they ended
            ray_cluster.check_head()
        self._drain(result)
        return result

    def _collect_outcomes(self, done: list, result: GroupPoll) -> None:
        for ref in done:
            rank = self._runs.pop(ref)
            try:
                ray.get(ref)
                result.finished_ranks.append(rank)
            except RayActorError as exc:
                result.failures.append(WorkerFailure(rank, "died", _short(exc), self._info(rank), time.time()))
                self._lose(rank)
            except RayTaskError as exc:
                result.failures.append(WorkerFailure(rank, "error", _cause_text(exc), self._info(rank), time.time()))

    def _lose(self, rank: int) -> None:
        """``rank``'s actor is gone: its drain is not waited for, now or later."""
        self._dead.add(rank)
        self._drains.pop(rank, None)

    def _settle_failures(self, result: GroupPoll) -> None:
        deadline = time.time() + self.settle_s
        while self._runs and time.time() < deadline:
            done, _ = ray.wait(list(self._runs), num_returns=len(self._runs), timeout=max(0.0, deadline - time.time()))
            self._collect_outcomes(done, result)
            if not done:
                break

    def _drain(self, result: GroupPoll) -> None:
        """Collect what the ranks buffered. A rank that does not answer at once
        (stopped, or busy holding the GIL) keeps its request pending for the
        next poll, so one wedged rank never stalls the driver."""
        for rank, actor in enumerate(self._actors):
            if rank not in self._drains and rank not in self._dead:
                self._drains[rank] = actor.drain.remote()
        deadline = time.monotonic() + DRAIN_WAIT_S
        while self._drains:
            # Each drain as it comes back, while the others are still awaited (a lost node's rank never answers).
            pending = {ref: rank for rank, ref in self._drains.items()}
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            for ref in ready:
                self._take_drain(pending[ref], ref, result)
        result.steps.sort(key=lambda r: r.step)

    def _take_drain(self, rank: int, ref, result: GroupPoll) -> None:
        del self._drains[rank]
        try:
            items = ray.get(ref)
        except RayActorError:
            return  # a dead rank has nothing more to say
        for kind, item in items:
            {"step": result.steps, "checkpoint": result.checkpoints, "heartbeat": result.heartbeats,
             "started": result.starts, "local_norms": result.local_norms}[kind].append(item)

    def _info(self, rank: int) -> WorkerInfo | None:
        return self._infos[rank] if rank < len(self._infos) else None

    def shutdown(self) -> None:
        for actor in self._actors:
            self.rank_actors.kill(actor)
        self._actors, self._runs, self._drains, self._dead = [], {}, {}, set()
        self.rank_actors.release(self._pg)
        self._pg = None


def _short(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:500] if text else type(exc).__name__


def _cause_text(exc: RayTaskError) -> str:
    """The trainer's own exception text (last lines of its traceback)."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return "\n".join(lines[-3:])[:2000]
