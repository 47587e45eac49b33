"""The ranks of one sub-run as Ray actors in a placement group.

The controller talks to a :class:`WorkerGroup` only; tests use a fake one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from runmgr.config.schema import ClusterConfig
from runmgr.errors import ClusterError
from runmgr.placement import actor_resources, bundle_for
from runmgr.workers.actor import RemoteTrainerWorker, WorkerInfo, WrapReporter
from trainer.config import TrainerConfig
from trainer.plan import ResumePlan
from trainer.report import CheckpointReport, Heartbeat, StartReport, StepReport

# After the first failure, how long to wait for the others to surface so that
# the root cause (a dead process) wins over its echo (a peer's broken socket).
FAILURE_SETTLE_S = 1.0
# How long one poll waits for the ranks' buffered reports.
DRAIN_WAIT_S = 0.5


@dataclass(frozen=True)
class WorkerFailure:
    """A rank that stopped: ``died`` (its process is gone) or ``error`` (it raised)."""

    rank: int
    kind: str
    text: str
    worker: WorkerInfo | None
    time: float

    @property
    def is_peer_echo(self) -> bool:
        """True when this rank only saw another rank go away."""
        lowered = self.text.lower()
        return self.kind == "error" and any(s in lowered for s in ("connection closed by peer", "connection reset", "broken pipe", "gloo"))


@dataclass
class GroupPoll:
    """What one poll of the group brought back."""

    steps: list[StepReport] = field(default_factory=list)
    checkpoints: list[CheckpointReport] = field(default_factory=list)
    heartbeats: list[Heartbeat] = field(default_factory=list)
    starts: list[StartReport] = field(default_factory=list)
    finished_ranks: list[int] = field(default_factory=list)
    failures: list[WorkerFailure] = field(default_factory=list)


class WorkerGroup(Protocol):
    """What the controller needs from the ranks of a sub-run."""

    def start(self, config: TrainerConfig, plan: ResumePlan) -> list[WorkerInfo]: ...

    def poll(self, timeout_s: float) -> GroupPoll: ...

    def shutdown(self) -> None: ...


def root_cause(failures: list[WorkerFailure]) -> WorkerFailure:
    """The failure that explains the others: a dead process before an error,
    a real error before a peer's echo of it, then the earliest."""
    def rank_of(f: WorkerFailure) -> tuple[int, float]:
        order = 0 if f.kind == "died" else (2 if f.is_peer_echo else 1)
        return order, f.time
    return min(failures, key=rank_of)


class RayWorkerGroup:
    """One actor per rank, placed by a placement group over the cluster."""

    def __init__(self, cluster: ClusterConfig, device_kind: str, start_timeout_s: float, lease_s: float,
                 allowed_node_ids: list[str] | None = None, wrap_reporter: WrapReporter | None = None) -> None:
        """``allowed_node_ids``: place ranks only on these Ray nodes (health-check
        admissions minus excluded nodes); None: anywhere the placement group fits.
        ``wrap_reporter``: what every rank's reports pass through (chaos's pauses)."""
        self.wrap_reporter = wrap_reporter
        self.cluster = cluster
        self.lease_s = lease_s
        self.allowed_node_ids = allowed_node_ids
        self.device_kind = device_kind
        self.start_timeout_s = start_timeout_s
        self._pg = None
        self._actors: list = []
        self._infos: list[WorkerInfo] = []
        self._runs: dict = {}
        self._drains: dict = {}

    @property
    def workers(self) -> list[WorkerInfo]:
        return list(self._infos)

    def start(self, config: TrainerConfig, plan: ResumePlan) -> list[WorkerInfo]:
        world = self.cluster.num_workers
        if self.allowed_node_ids is not None:
            strategies = self._pinned_strategies(world, lambda size: not config.problems(size))
            world = len(strategies)
        else:
            strategies = self._placement(world)
        self._actors = [
            RemoteTrainerWorker.options(
                **actor_resources(self.device_kind, self.cluster.cpus_per_worker, self.cluster.devices_per_worker),
                scheduling_strategy=strategy,
            ).remote(rank, world, self.lease_s)
            for rank, strategy in enumerate(strategies)
        ]
        try:
            self._infos = ray.get([a.describe.remote() for a in self._actors], timeout=self.start_timeout_s)
        except GetTimeoutError:
            self.shutdown()
            raise ClusterError(f"{world} workers did not start within {self.start_timeout_s:.0f} s "
                               f"(free resources: {ray.available_resources()})") from None
        port = ray.get(self._actors[0].reserve_port.remote())
        master = self._infos[0].node_ip
        self._runs = {a.run.remote(config, plan, master, port, self.wrap_reporter): rank
                      for rank, a in enumerate(self._actors)}
        return self.workers

    def _placement(self, world: int) -> list:
        """One bundle per rank in a placement group over the whole cluster."""
        bundle = bundle_for(self.device_kind, self.cluster.cpus_per_worker, self.cluster.devices_per_worker)
        self._pg = placement_group([dict(bundle) for _ in range(world)], strategy=self.cluster.placement_strategy)
        try:
            ray.get(self._pg.ready(), timeout=self.start_timeout_s)
        except GetTimeoutError:
            self.shutdown()
            raise ClusterError(
                f"the cluster could not place {world} workers of {bundle} within {self.start_timeout_s:.0f} s: "
                f"free resources are {ray.available_resources()}; lower cluster.num_workers or add nodes"
            ) from None
        return [PlacementGroupSchedulingStrategy(self._pg, placement_group_bundle_index=rank) for rank in range(world)]

    def _pinned_strategies(self, world: int, valid_world: Callable[[int], bool]) -> list:
        """Ranks pinned to the allowed nodes, packed in node order by capacity.
        When the allowed nodes cannot hold ``world`` ranks (a node was excluded
        and there is no spare), data parallel shrinks to the largest world size
        that still divides the global batch (accumulation keeps it whole)."""
        bundle = bundle_for(self.device_kind, self.cluster.cpus_per_worker, self.cluster.devices_per_worker)
        slots: list[str] = []
        for node in ray.nodes():
            if node["Alive"] and node["NodeID"] in set(self.allowed_node_ids or ()):
                fits = min(int(node["Resources"].get(k, 0) // v) for k, v in bundle.items() if v > 0)
                slots += [node["NodeID"]] * fits
        fitting = [size for size in range(min(world, len(slots)), 0, -1) if valid_world(size)]
        if not fitting:
            raise ClusterError(
                f"the {len(self.allowed_node_ids or ())} allowed nodes hold {len(slots)} workers of {bundle}, "
                f"and no smaller world size divides the global batch: add nodes (excluded nodes stay out)")
        return [NodeAffinitySchedulingStrategy(node_id, soft=False) for node_id in slots[:fitting[0]]]

    def poll(self, timeout_s: float) -> GroupPoll:
        result = GroupPoll()
        pending = list(self._runs)
        done, _ = ray.wait(pending, num_returns=len(pending), timeout=timeout_s) if pending else ([], [])
        self._collect_outcomes(done, result)
        if result.failures:
            self._settle_failures(result)
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
            except RayTaskError as exc:
                result.failures.append(WorkerFailure(rank, "error", _cause_text(exc), self._info(rank), time.time()))

    def _settle_failures(self, result: GroupPoll) -> None:
        deadline = time.time() + FAILURE_SETTLE_S
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
            if rank not in self._drains:
                self._drains[rank] = actor.drain.remote()
        ready, _ = ray.wait(list(self._drains.values()), num_returns=len(self._drains), timeout=DRAIN_WAIT_S)
        ready_set = set(ready)
        for rank, ref in list(self._drains.items()):
            if ref not in ready_set:
                continue
            del self._drains[rank]
            try:
                items = ray.get(ref)
            except RayActorError:
                continue  # a dead rank has nothing more to say
            for kind, item in items:
                {"step": result.steps, "checkpoint": result.checkpoints, "heartbeat": result.heartbeats,
                 "started": result.starts}[kind].append(item)
        result.steps.sort(key=lambda r: r.step)

    def _info(self, rank: int) -> WorkerInfo | None:
        return self._infos[rank] if rank < len(self._infos) else None

    def shutdown(self) -> None:
        for actor in self._actors:
            ray.kill(actor, no_restart=True)
        self._actors, self._runs, self._drains = [], {}, {}
        if self._pg is not None:
            remove_placement_group(self._pg)
            self._pg = None


def _short(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:500] if text else type(exc).__name__


def _cause_text(exc: RayTaskError) -> str:
    """The trainer's own exception text (last lines of its traceback)."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return "\n".join(lines[-3:])[:2000]
