"""The node actors of a Megatron-style lineage, kept from one sub-run to the next.

Each node of a sub-run is a :mod:`megatron_node` actor: a Ray worker process of its own, about
a CPU-second to start, and at a thousand nodes a restart would start a thousand. The actors of
the last sub-run serve the next one when it wants as many nodes and none of them is on a node
the plan avoids; otherwise they are ended and new ones placed. Between sub-runs an actor runs
no command (the group stopped it) and is reset before the next one starts: a command of the
last sub-run never reports into the next.

Given a device poll, each actor reads its node's devices (runmgr/workers/megatron_node.py), and
``on_held`` is told which nodes a placement's actors hold before they start, so that the device
poll's pollers run only on the admitted nodes no node actor holds (runmgr/wiring.py).
"""

from __future__ import annotations

from typing import Callable, Optional

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from runmgr import cluster as ray_cluster
from runmgr.config.schema import ClusterConfig
from runmgr.errors import ClusterError
from runmgr.nodes import node_name
from runmgr.placement import actor_resources, bundle_for
from runmgr.workers.devicepoll import DevicePollSettings
from runmgr.workers.lease import DriverIdentity
from runmgr.workers.megatron_node import RemoteMegatronNode
from runmgr.workers.placing import node_of, place, release


class MegatronNodes:
    """One actor per node, placed for a sub-run and kept for the next while it fits."""

    def __init__(self, cluster: ClusterConfig, device_kind: str, nproc_per_node: int, start_timeout_s: float,
                 lease_s: float, admitted_node_ids: Optional[list[str]] = None,
                 driver: Optional[DriverIdentity] = None, device_poll: Optional[DevicePollSettings] = None,
                 on_held: Optional[Callable[[frozenset[str]], None]] = None) -> None:
        """``lease_s``: how long a node runs without hearing from its driver (each reset and
        drain renews it); ``driver``: who drives the nodes (this process unless given);
        ``device_poll``: how each actor reads its node's devices (None: they do not);
        ``on_held``: told the Ray ids of the nodes a new placement's actors hold, before they
        start (so a poller there ends before the actor reads the node), and an empty set when a
        placement failed after the last actors ended (as the node agents tell it:
        runmgr/workers/ray_node_agents.py)."""
        self.cluster = cluster
        self.device_kind = device_kind
        self.nproc_per_node = nproc_per_node
        self.start_timeout_s = start_timeout_s
        self.lease_s = lease_s
        self.admitted_node_ids = admitted_node_ids
        self.driver = driver or DriverIdentity.of_this_process()
        self.device_poll = device_poll
        self.on_held = on_held
        self.placed = 0
        """How many actors were placed in all (kept ones are counted once)."""
        self._pg = None
        self._actors: list = []
        self._described: list[dict] = []

    def for_subrun(self, nnodes: int, avoid: tuple[str, ...]) -> tuple[list, list[dict]]:
        """``nnodes`` actors, none on a node in ``avoid`` (node names), each with no command and
        a renewed lease, and each one's ``describe()``: the kept ones when they fit."""
        if self._actors and (len(self._actors) != nnodes or self._on_avoided(avoid) or not self._reset()):
            self.close()
        if not self._actors:
            try:
                self._place(nnodes, avoid)
            except ClusterError:
                self._tell_held(frozenset())  # no node actor reads a node now, until a placement succeeds
                raise
        return list(self._actors), list(self._described)

    def _tell_held(self, nodes: frozenset[str]) -> None:
        if self.on_held is not None:
            self.on_held(nodes)

    def _on_avoided(self, avoid: tuple[str, ...]) -> bool:
        return any(node_name(where["node_id"]) in avoid for where in self._described)

    def _reset(self) -> bool:
        """Every kept actor made ready for a new command; False when one of them is gone (its
        node, or its lease ran out between sub-runs)."""
        try:
            ray_cluster.get_while_head_lives([actor.reset.remote() for actor in self._actors], self.start_timeout_s)
        except (RayActorError, GetTimeoutError):
            return False
        return True

    def _place(self, nnodes: int, avoid: tuple[str, ...]) -> None:
        cpus = self.cluster.cpus_per_worker * self.nproc_per_node
        devices = self.cluster.devices_per_worker * self.nproc_per_node
        self._pg, strategies = place(bundle_for(self.device_kind, cpus, devices), nnodes, "nodes",
                                     self.cluster.placement_strategy, self.start_timeout_s,
                                     self.admitted_node_ids, avoid)
        node_ids = [node_of(strategy) for strategy in strategies]
        self._tell_held(frozenset(node_ids))
        self._actors = [RemoteMegatronNode.options(**actor_resources(self.device_kind, cpus, devices),
                                                   scheduling_strategy=strategy).remote(
                            node, self.lease_s, self.driver, device_poll=self.device_poll, node=node_name(node_id))
                        for node, (strategy, node_id) in enumerate(zip(strategies, node_ids))]
        self.placed += nnodes
        try:
            self._described = ray_cluster.get_while_head_lives([a.describe.remote() for a in self._actors],
                                                               self.start_timeout_s)
        except GetTimeoutError:
            free = ray.available_resources()
            self.close()
            raise ClusterError(f"{nnodes} nodes did not start within {self.start_timeout_s:.0f} s "
                               f"(free resources: {free})") from None
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """End every actor and release their placement."""
        for actor in self._actors:
            ray.kill(actor, no_restart=True)
        self._actors, self._described = [], []
        release(self._pg)
        self._pg = None
