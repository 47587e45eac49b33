"""The Ray nodes a check looks at, and how they are named for people and
for the exclusion history."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from runmgr.config.schema import ClusterConfig
from runmgr.placement import bundle_for
from runmgr.policy.capacity import slots_of

SHORT_ID_CHARS = 12
"""Characters of a Ray node id that name it on screen (as incidents do)."""


@dataclass(frozen=True)
class RayNode:
    """One alive Ray node."""

    node_id: str
    """Ray's hex node id: what placement and the reports are keyed by."""
    ip: str
    """Address the raylet advertises."""
    hostname: str
    """Host name of the machine the raylet runs on."""

    @property
    def short_id(self) -> str:
        return self.node_id[:SHORT_ID_CHARS]

    def display(self) -> str:
        """``host 10.0.0.5 3f2a9c1b0d4e``: readable, and unique even when
        several Ray nodes share a host (the id tells them apart)."""
        return f"{self.hostname} {self.short_id}"

    def to_dict(self) -> dict:
        return {"node_id": self.node_id, "ip": self.ip, "hostname": self.hostname}


def nodes_from_ray_table(table: Iterable[Mapping]) -> list[RayNode]:
    """Alive nodes of ``ray.nodes()``, in a stable order (host, then id)."""
    alive = [RayNode(str(row["NodeID"]), str(row.get("NodeManagerAddress", "")),
                     str(row.get("NodeManagerHostname", "")))
             for row in table if row.get("Alive")]
    return sorted(alive, key=lambda n: (n.hostname, n.ip, n.node_id))


def alive_nodes() -> list[RayNode]:
    """The alive nodes of the connected Ray cluster."""
    import ray

    return nodes_from_ray_table(ray.nodes())


def rank_nodes(cluster: ClusterConfig, device_kind: str) -> list[RayNode]:
    """The alive nodes that can hold one of the run's ranks: the fleet a health check judges.
    A node that can hold none (on KubeRay, the driver's own head pod: ``num-cpus: 0``, no
    accelerator) is no machine of the run's: compared with the training nodes it would stand
    out in every figure and be excluded, and its Kubernetes node labelled, for nothing."""
    import ray

    alive = [row for row in ray.nodes() if row.get("Alive")]
    bundle = bundle_for(device_kind, cluster.cpus_per_worker, cluster.devices_per_worker)
    slots = slots_of({str(row["NodeID"]): row.get("Resources", {}) for row in alive}, bundle)
    return nodes_from_ray_table(row for row in alive if slots[str(row["NodeID"])] > 0)


def history_keys(nodes: Sequence[RayNode]) -> dict[str, str]:
    """Node id -> the key its exclusion history is kept under.

    A Ray node id changes whenever its raylet restarts, so machines are
    tracked by host name; where several Ray nodes share a host (a test
    cluster on one machine) the host cannot tell them apart and the id is used.
    """
    per_host = Counter(n.hostname for n in nodes)
    return {n.node_id: (f"host:{n.hostname}" if n.hostname and per_host[n.hostname] == 1
                        else f"ray:{n.node_id}") for n in nodes}
