"""The driver's side of the node agents (runmgr/workers/node_agent.py): places a sub-run's ranks
and spares, starts one :class:`NodeAgent` per node that got them (a Ray actor inside a bundle
reserved on its node, holding all their resources), and asks, stops and kills them.
:class:`RayNodeAgents` is the :class:`runmgr.workers.agent_group.NodeAgents` the agent group and
the warm part use; the agent's own side (forking, pushing, the lease) is node_agent.py's."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from runmgr import cluster as ray_cluster
from runmgr.agents.cadence import beat_interval_s
from runmgr.agents.device_slices import NoFreeDevices
from runmgr.agents.rank_processes import WrapReporter
from runmgr.agents.warm_link import PackedAnswer, WarmRun
from runmgr.config.schema import ClusterConfig
from runmgr.controller.group import WorkerInfo
from runmgr.errors import ClusterError
from runmgr.nodes import node_name
from runmgr.placement import actor_resources, bundle_for
from runmgr.workers.agent_group import NodePlace
from runmgr.workers.devicepoll import DevicePollSettings
from runmgr.workers.lease import DriverIdentity
from runmgr.workers.node_agent import PUSH_INTERVAL_S, STOP_GRACE_S, STOP_MARGIN_S, NodeAgent
from runmgr.policy.capacity import slots_of
from runmgr.workers.placing import node_of, place, release, reserve_nodes, usable_nodes

RemoteNodeAgent = ray.remote(max_concurrency=4, max_restarts=0)(NodeAgent)


def spares_with_room(bundle: Mapping[str, float], world: int, extra: int,
                     nodes: Mapping[str, Mapping[str, float]]) -> int:
    """How many of ``extra`` spares fit beside ``world`` ranks on ``nodes`` (name -> resources),
    each rank and spare a ``bundle`` on one node."""
    return max(0, min(extra, sum(slots_of(nodes, bundle).values()) - world))


@dataclass
class RayNodeAgents:
    """One :class:`NodeAgent` per node that got ranks (:class:`runmgr.workers.agent_group.NodeAgents`).

    The ranks are placed as the per-rank group places them (a bundle each, the cluster's
    strategy, away from the plan's avoided nodes); the ranks Ray put on one node are that node's
    agent's, and the agent holds all their resources (:meth:`_new_places` says why and how)."""

    cluster: ClusterConfig
    device_kind: str
    start_timeout_s: float
    admitted_node_ids: Optional[list[str]] = None
    push_interval_s: float = PUSH_INTERVAL_S
    lease_s: float = float("inf")
    """The driver lease each agent holds for its ranks (``controller.worker_lease_s``)."""
    wrap_reporter: Optional[WrapReporter] = None
    """What every rank's reports pass through (chaos's pauses still to come); set per sub-run."""
    driver: Optional[DriverIdentity] = None
    """Whose lease the agents hold (None: this process's), so that an agent tells a silent driver
    from a dead one."""
    device_poll: Optional[DevicePollSettings] = None
    """How each agent reads its node's devices mid-run (None: no device poll on these nodes)."""
    on_held: Optional[Callable[[frozenset[str]], None]] = None
    """Told the Ray ids of the nodes a new placement's agents hold, once Ray placed the bundles and
    reserved the nodes' room, and before those agents start (so a poller there ends before the agent reads the node), and an
    empty set when a placement failed after the last agents ended: the device poll of the admitted
    nodes no agent reads follows it (runmgr/wiring.py)."""

    def __post_init__(self) -> None:
        self._places: list[NodePlace] = []
        self._reservation: Optional[PlacementGroup] = None
        """The placement group of the agents' bundles (one per node), held while they live."""
        if self.driver is None:
            self.driver = DriverIdentity.of_this_process()

    def place(self, world: int, avoid_nodes: Sequence[str], extra: int = 0) -> list[NodePlace]:
        """The last sub-run's agents again when they all live, hold ``world`` ranks and ``extra``
        spares and none is on an avoided node (their fork servers have the trainer imported);
        otherwise new ones. When the plan avoids nodes (lost or left out mid-run), ``extra`` is
        what the nodes left hold beside the ranks: a node's loss must not stop a restart that its
        ranks fit (the warm group says which spares were not placed)."""
        if extra and avoid_nodes:
            bundle = bundle_for(self.device_kind, self.cluster.cpus_per_worker, self.cluster.devices_per_worker)
            left = {node_name(node_id): resources for node_id, resources in usable_nodes(self.admitted_node_ids).items()
                    if node_name(node_id) not in avoid_nodes}
            extra = spares_with_room(bundle, world, extra, left)
        if self._reusable(world, avoid_nodes, extra):
            return self._places
        self.close()
        try:
            self._places = self._new_places(world, avoid_nodes, extra)
        except ClusterError:
            self._tell_held(frozenset())  # no agent reads a node now, until a placement succeeds
            raise
        return self._places

    def _tell_held(self, nodes: frozenset[str]) -> None:
        if self.on_held is not None:
            self.on_held(nodes)

    def _reusable(self, world: int, avoid_nodes: Sequence[str], extra: int) -> bool:
        if sum(len(place.ranks) for place in self._places) != world:
            return False
        if sum(place.spares for place in self._places) != extra:
            return False
        if any(place.node in avoid_nodes for place in self._places):
            return False
        try:
            ray.get([place.where.ready.remote() for place in self._places], timeout=self.start_timeout_s)
        except (RayActorError, GetTimeoutError):
            return False  # an agent died (its node, or a kill) or does not answer: place anew
        return True

    def _new_places(self, world: int, avoid_nodes: Sequence[str], extra: int) -> list[NodePlace]:
        """Ray places one bundle per rank (so the cluster's strategy, the admitted and avoided
        nodes and the refusals are the per-rank group's); then each node's agent runs inside one
        bundle of its node's ranks' bundles summed. Ray hands an actor the devices of its one
        bundle only, and an actor cannot span bundles: an agent in its first rank's bundle would
        hold one rank's devices. So the nodes' summed bundles are reserved in one placement group
        (each pinned to its node, all at once or none: :func:`reserve_nodes`), asked for before
        the per-rank group is released, and held for the agents' whole life (:meth:`close`
        releases it): each agent starts in room already reserved for it (docs/scale.md, "No gap
        between the placement and the agents", says what window is left). A warm run's ``extra``
        spares get a bundle each too: their node's agent holds their room (they are forked under
        it)."""
        cluster, kind = self.cluster, self.device_kind
        bundle = bundle_for(kind, cluster.cpus_per_worker, cluster.devices_per_worker)
        what = f"workers and {extra} spare(s)" if extra else "workers"
        pg, strategies = place(bundle, world + extra, what, cluster.placement_strategy,
                               self.start_timeout_s, self.admitted_node_ids, tuple(avoid_nodes))
        by_node: dict[str, list[int]] = defaultdict(list)
        for slot, strategy in enumerate(strategies):
            by_node[node_of(strategy)].append(slot)  # slots past the world are spares
        self._reservation = reserve_nodes({node_id: len(slots) for node_id, slots in by_node.items()}, bundle,
                                          self.start_timeout_s, replacing=pg)
        self._tell_held(frozenset(by_node))
        beats = beat_interval_s(self.push_interval_s, len(by_node), self.lease_s)
        threads = max(1, int(cluster.cpus_per_worker))  # Ray's rule for one rank actor's threads
        places = []
        for index, (node_id, slots) in enumerate(by_node.items()):
            options = actor_resources(kind, cluster.cpus_per_worker * len(slots),
                                      cluster.devices_per_worker * len(slots))
            inside = PlacementGroupSchedulingStrategy(self._reservation, placement_group_bundle_index=index)
            agent = RemoteNodeAgent.options(scheduling_strategy=inside, **options).remote(
                node_name(node_id), self.push_interval_s, self.lease_s, self.driver, beats,
                kind, cluster.devices_per_worker, threads, self.device_poll)
            ranks = tuple(slot for slot in slots if slot < world)
            places.append(NodePlace(node_name(node_id), ranks, agent, spares=len(slots) - len(ranks)))
        return places

    def rendezvous(self, place: NodePlace) -> tuple[str, int]:
        (where,) = ray_cluster.get_while_head_lives([place.where.rendezvous.remote()], self.start_timeout_s)
        return where

    def describe(self, place: NodePlace):
        return place.where.describe.remote()

    def start(self, place: NodePlace, world: int, master: tuple[str, int], config: Any, plan: Any,
              rank_nodes: Any, inbox: Any, warm: Optional[WarmRun] = None):
        return place.where.run.remote(place.ranks, world, master, config, plan, rank_nodes, inbox,
                                      self.wrap_reporter, warm)

    def start_spares(self, place: NodePlace, count: int, buddy_offset: int) -> list[int]:
        """Fork ``count`` warm spares on ``place``'s node; their keys there. :class:`NoFreeDevices`
        in the agent's words when the node has no device slice free for one (its ``started``: the
        keys of those forked before it)."""
        try:
            (keys,) = ray_cluster.get_while_head_lives([place.where.start_spares.remote(count, buddy_offset)],
                                                       self.start_timeout_s)
        except RayTaskError as exc:
            if isinstance(exc.cause, NoFreeDevices):
                raise exc.cause from None  # the node's words, not a remote traceback
            raise
        return keys

    def waiting(self, places: Sequence[NodePlace]) -> set[int]:
        """The ranks of ``places``' nodes that wait in their warm link: one call per node."""
        answers = ray_cluster.get_while_head_lives([place.where.waiting.remote() for place in places],
                                                   self.start_timeout_s)
        return {rank for ranks in answers for rank in ranks}

    def regroup(self, place: NodePlace, subrun: str, named: dict[int, int], answers: dict[int, Any],
                rank_nodes: Optional[dict[int, str]]):
        """An object ref of the :class:`WorkerInfo` of the spares ``named`` on ``place``'s node,
        once its ranks of ``answers`` were told where the group re-forms. The answers go pickled
        (:class:`PackedAnswer`): the agent passes them on without importing their classes."""
        packed = {rank: PackedAnswer.of(answer) for rank, answer in answers.items()}
        return place.where.regroup.remote(subrun, named, packed, rank_nodes)

    def probe(self, place: NodePlace) -> Any:
        """The lost-node probe's call to ``place``'s node, once for all its ranks (an object ref
        of those that wait; none comes while the node is gone)."""
        return place.where.waiting.remote()

    def collect(self, calls: list) -> list:
        """The answers of ``calls`` (object refs of the agents' calls), while the head lives."""
        return ray_cluster.get_while_head_lives(calls, self.start_timeout_s)

    def dump_stacks(self, place: NodePlace) -> dict[int, str]:
        """``{rank: text}`` of the node's ranks (empty when its agent does not answer)."""
        try:
            return ray.get(place.where.dump_stacks.remote(), timeout=STOP_GRACE_S + STOP_MARGIN_S)
        except (RayActorError, GetTimeoutError) as exc:
            return {rank: f"rank {rank}: its agent on node {place.node} did not dump its stack ({type(exc).__name__})\n"
                    for rank in place.ranks}

    def kill_rank(self, place: NodePlace, rank: int) -> None:
        place.where.kill_rank.remote(rank)

    def stop(self, place: NodePlace) -> None:
        """End the node's ranks; its agent stays for the next sub-run (:meth:`close` ends it)."""
        try:
            ray.get(place.where.stop.remote(), timeout=STOP_GRACE_S + STOP_MARGIN_S)
        except (RayActorError, GetTimeoutError):
            ray.kill(place.where, no_restart=True)  # a dead or wedged agent is not served again

    def release(self) -> None:
        """Nothing: the agents and their bundles are kept for the next sub-run."""

    def close(self) -> None:
        """End every agent (and so its fork server and ranks, and the resources it holds): when
        the launch ends, or when the next sub-run needs other nodes."""
        for place in self._places:
            ray.kill(place.where, no_restart=True)
        self._places = []
        release(self._reservation)  # the agents' room, held until now
        self._reservation = None


