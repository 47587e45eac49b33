"""The Ray side of replacing an excluded node (runmgr/kuberay.py asks KubeRay for
the pod): which pod a Ray node runs in, and the room of the usable nodes, where a
node that joined after the launch's health check (KubeRay's replacement) is
probed alone first and, when it passes, admitted to the run's nodes."""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import ray

from runmgr.config.schema import RunConfig
from runmgr.nodes import node_name
from runmgr.healthcheck.gate import check_and_record, store_for
from runmgr.healthcheck.nodes import alive_nodes
from runmgr.workers.placing import node_slots


class JoiningNodes:
    """Nodes that join the run's Ray cluster while it runs."""

    def __init__(self, config: RunConfig, device_kind: str, admitted: Optional[list[str]],
                 say: Callable[[str], None], on_admitted: Callable[[str], None] = lambda node_id: None) -> None:
        """``admitted``: the launch's admitted node ids, the list the worker groups place on
        (None: every alive node is usable); a joined node that passes is appended to it, and
        ``on_admitted(node_id)`` called (the device poll starts watching it)."""
        self.config, self.device_kind, self.admitted, self.say = config, device_kind, admitted, say
        self.on_admitted = on_admitted
        self.known = {node.node_id for node in alive_nodes()}
        self.turned_away: dict[str, list[str]] = {}
        """Joined nodes the probes excluded, with why."""

    def pod_of(self, node: str) -> Optional[str]:
        """The host name of the Ray node decisions call ``node`` (on KubeRay: its pod's name)."""
        return next((str(row.get("NodeManagerHostname") or "") or None for row in ray.nodes()
                     if node_name(str(row["NodeID"])) == node), None)

    def room(self, avoid: Sequence[str]) -> int:
        """Ranks the usable nodes outside ``avoid`` hold, once the nodes that joined are judged."""
        self._admit_joined()
        slots = node_slots(self.config.cluster, self.device_kind, self.admitted)
        return sum(count for node, count in slots.items() if node not in avoid)

    def _admit_joined(self) -> None:
        joined = [node for node in alive_nodes() if node.node_id not in self.known]
        if not joined:
            return
        self.known |= {node.node_id for node in joined}
        if self.config.health.skip:
            passed = [node.node_id for node in joined]
        else:  # alone: its devices, ECC, mounts and software; its speed has no peers here
            check, _, _ = check_and_record(self.config.health, self.device_kind, store_for(self.config),
                                           "replacement", self.say, nodes=joined)
            passed = check.admitted_node_ids
            self.turned_away.update(check.excluded)
        for node_id in passed:
            self.say(f"node {node_name(node_id)} joined and was admitted (a replacement)")
            if self.admitted is not None and node_id not in self.admitted:
                self.admitted.append(node_id)
            self.on_admitted(node_id)
