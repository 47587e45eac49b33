"""The ranks of one sub-run as Ray actors, placed as the sub-run's plan says.

The controller talks to a :class:`runmgr.controller.group.WorkerGroup` only;
tests use a fake one. This group carries the plan out (its data-parallel
size, the nodes it avoids) and never decides anything itself: when the
cluster cannot hold the plan it raises :class:`ClusterError`, and the policy
decides (retry, resize, or a human).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence
from typing import Optional, Protocol

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from runmgr import cluster as ray_cluster
from runmgr.config.schema import ClusterConfig
from runmgr.controller.group import GroupPoll, WorkerFailure, WorkerInfo
from runmgr.errors import ClusterError
from runmgr.placement import actor_resources, bundle_for
from runmgr.policy.warm import buddy_offset
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


class LostRanks(Protocol):
    """What tells the group, before Ray does, that a rank's node is gone: a warm group's
    liveness probe (runmgr/workers/liveness.py's ``PeerProbe``). A plain group has none and
    waits for Ray's word."""

    def send(self, actors: Mapping[int, object]) -> None:
        """Probe the ranks of ``actors`` (by rank) that need it."""

    def arm(self, waiting: Collection[int]) -> None:
        """Ranks of ``waiting`` wait in their warm link: start probing the others."""

    def check(self, workers: Sequence[WorkerInfo]) -> "Unreachable":
        """The ranks found lost, with the failure's text (``.unreachable``)."""

    def forget(self, rank: int) -> None:
        """``rank`` is known lost: stop probing it."""


class Unreachable(Protocol):
    unreachable: Mapping[int, str]


class RankActors(Protocol):
    """Where a group's rank actors come from and go: one Ray actor process per rank
    (:class:`RayRankActors`), or the scale harness's simulated ranks, many to a process
    (runmgr/scale/hosts.py)."""

    def place(self, count: int, what: str, avoid_nodes: Sequence[str]) -> tuple[object, list]:
        """Room for ``count`` actors (``what``, for the error): a handle for :meth:`release` and
        where each actor goes; a :class:`ClusterError` when the cluster cannot hold them."""

    def create(self, strategy, rank: int, world: int, driver: DriverIdentity):
        """The actor of ``rank`` (-1: a spare) of ``world``, placed by ``strategy``; it starts
        in the background."""

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
    """One actor per rank, placed as the plan says. A warm group
    (runmgr/workers/warm_group.py) holds one and changes its ranks only through
    :meth:`replace` and :meth:`kill`."""

    def __init__(self, cluster: ClusterConfig, device_kind: str, start_timeout_s: float, lease_s: float,
                 admitted_node_ids: Optional[list[str]] = None, wrap_reporter: WrapReporter | None = None,
                 lost_ranks: LostRanks | None = None, settle_s: float = FAILURE_SETTLE_S,
                 rank_actors: RankActors | None = None) -> None:
        """``admitted_node_ids``: the nodes the health check admitted (None: it did not
        run, every alive node may be used). ``wrap_reporter``: what every rank's
        reports pass through (chaos's pauses). ``lost_ranks``: what names a lost node's
        ranks before Ray does (a warm group's probe). ``settle_s``: how long, after a
        first failure, the others are given to surface. ``rank_actors``: where the ranks'
        actors come from (None: one trainer process per rank, :class:`RayRankActors`)."""
        self.rank_actors = rank_actors or RayRankActors(cluster, device_kind, start_timeout_s, lease_s,
                                                        admitted_node_ids)
        self.wrap_reporter = wrap_reporter
        self.lost_ranks = lost_ranks
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
        self._strategies: list = []
        """Where each rank's actor was placed (a bundle of the placement group, or a node)."""
        self._extra_strategies: list = []
        self.settle_s = settle_s

    @property
    def workers(self) -> list[WorkerInfo]:
        return list(self._infos)

    @property
    def world_size(self) -> int:
        return self._world

    @property
    def extra_strategies(self) -> tuple:
        """Where the ``extra`` actors of :meth:`start` may be placed (a warm group's spares)."""
        return tuple(self._extra_strategies)

    def actor(self, rank: int):
        return self._actors[rank]

    def strategy(self, rank: int):
        """Where ``rank``'s actor was placed."""
        return self._strategies[rank]

    def start(self, config: TrainerConfig, plan: ResumePlan, extra: int = 0,
              warm: bool = False) -> list[WorkerInfo]:
        """Place the ranks and room for ``extra`` more actors (:attr:`extra_strategies`),
        and start training (``warm``: with the warm link)."""
        ray_cluster.check_head()  # placing ranks needs the head: without it Ray waits until it ends the driver
        world = config.world_size_of(plan.data_parallel_size) if plan.data_parallel_size else self.cluster.num_workers
        self._world = world
        what = f"workers and {extra} spare(s)" if extra else "workers"
        self._pg, strategies = self.rank_actors.place(world + extra, what, plan.avoid_nodes)
        self._strategies, self._extra_strategies = strategies[:world], strategies[world:]
        self._actors, self._infos = self.spawn(self._strategies, list(range(world)), "workers")
        port = ray.get(self._actors[0].reserve_port.remote())
        master = self._infos[0].node_ip
        offset = self.buddy_offset
        self._runs = {a.run.remote(config, plan, master, port, self.wrap_reporter, warm, offset): rank
                      for rank, a in enumerate(self._actors)}
        return self.workers

    @property
    def buddy_offset(self) -> int:
        """Where each rank's snapshot buddy sits, ranks on: on another node where there is one."""
        return buddy_offset([info.node_id for info in self._infos])

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
        """A rank's actor (``rank`` -1: a spare) placed by ``strategy``; it starts in the background."""
        return self.rank_actors.create(strategy, rank, self._world, self._driver)

    def replace(self, rank: int, actor, strategy, info: WorkerInfo, run) -> None:
        """``actor`` (placed by ``strategy``, training as ``run``) is ``rank`` from now on: a
        warm group's spare that took a lost rank's place."""
        self._actors[rank], self._strategies[rank], self._infos[rank] = actor, strategy, info
        self._runs = {ref: r for ref, r in self._runs.items() if r != rank}
        self._runs[run] = rank
        self._drains.pop(rank, None)
        self._dead.discard(rank)

    def kill(self, rank: int) -> None:
        """End ``rank``'s actor (a lost rank's, which may still live on an excluded node)."""
        self.rank_actors.kill(self._actors[rank])

    def poll(self, timeout_s: float) -> GroupPoll:
        self._send_probes()
        result = GroupPoll()
        pending = list(self._runs)
        done, _ = ray.wait(pending, num_returns=len(pending), timeout=timeout_s) if pending else ([], [])
        self._collect_outcomes(done, result)
        if result.failures:
            self._settle_failures(result)
        else:
            self._find_unreachable(result)
        if self._runs:  # ranks still training need the cluster; ranks that all returned are judged as they ended
            ray_cluster.check_head()
        self._drain(result)
        if not result.failures:  # the drain may have waited for a rank that never answers
            self._find_unreachable(result)
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
        if self.lost_ranks is not None:
            self.lost_ranks.forget(rank)

    def _send_probes(self) -> None:
        if self.lost_ranks is not None:
            self.lost_ranks.send({rank: actor for rank, actor in enumerate(self._actors) if rank not in self._dead})

    def _find_unreachable(self, result: GroupPoll) -> None:
        """Ranks lost without Ray's word yet (``lost_ranks`` names them: their peers wait for
        them and their node is gone), added to ``result.failures``."""
        if self.lost_ranks is None or not self._actors:
            return
        for rank, text in self.lost_ranks.check(self._infos).unreachable.items():
            result.failures.append(WorkerFailure(rank, "died", text, self._infos[rank], time.time()))
            self._runs = {ref: r for ref, r in self._runs.items() if r != rank}
            self._lose(rank)

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
        next poll, so one wedged rank never stalls the driver. Probes sent first
        age while the drain waits for a rank that does not answer (a lost node's
        never does), and are checked after it."""
        self._send_probes()
        for rank, actor in enumerate(self._actors):
            if rank not in self._drains and rank not in self._dead:
                self._drains[rank] = actor.drain.remote()
        deadline = time.monotonic() + DRAIN_WAIT_S
        while self._drains:
            # Each drain as it comes back: a rank that says it waits in its warm link is acted on
            # while the others are still awaited (a lost node's rank never answers).
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
             "started": result.starts, "local_norms": result.local_norms,
             "waiting": result.waiting_ranks}[kind].append(item)
        if rank in result.waiting_ranks and self.lost_ranks is not None:
            # A survivor waits for a lost peer: probe the others now; the rest of the drain's
            # wait ages the probes, so a lost node is named in this poll.
            self.lost_ranks.arm([rank])
            self._send_probes()

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
