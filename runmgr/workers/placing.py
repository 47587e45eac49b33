"""Where a sub-run's actors go: shared by the worker groups (one actor per rank
in :mod:`runmgr.workers.group`, one per node in :mod:`runmgr.workers.megatron_group`).

Each actor asks for one bundle; the bundles are placed as the plan says (away
from the nodes it avoids, on the nodes the health check admitted) or a
:class:`ClusterError` says why they cannot be.
"""

from __future__ import annotations

from typing import Mapping, Optional

import ray
from ray.exceptions import GetTimeoutError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from runmgr import cluster as ray_cluster
from runmgr.config.schema import ClusterConfig
from runmgr.controller.judge import node_name
from runmgr.errors import ClusterError
from runmgr.placement import bundle_for
from runmgr.policy.capacity import slots_of


def usable_nodes(admitted_node_ids: Optional[list[str]]) -> dict[str, Mapping[str, float]]:
    """Alive Ray nodes the run may use (the health check's admissions, or every alive
    node when none ran), by node id, with their total resources."""
    admitted = set(admitted_node_ids) if admitted_node_ids is not None else None
    return {node["NodeID"]: node["Resources"] for node in ray.nodes()
            if node["Alive"] and (admitted is None or node["NodeID"] in admitted)}


def node_slots(cluster: ClusterConfig, device_kind: str, admitted_node_ids: Optional[list[str]]) -> dict[str, int]:
    """Ranks of the run's size each usable node can hold, by node name (for the policy)."""
    bundle = bundle_for(device_kind, cluster.cpus_per_worker, cluster.devices_per_worker)
    nodes = usable_nodes(admitted_node_ids)
    return slots_of({node_name(node_id): resources for node_id, resources in nodes.items()}, bundle)


def release(pg: Optional[PlacementGroup]) -> None:
    """Remove a placement group, unless the head is gone (asking it would wait for Ray's 60 s)."""
    if pg is not None and not ray_cluster.head_lost():
        remove_placement_group(pg)


def place(bundle: Mapping[str, float], count: int, what: str, strategy: str, timeout_s: float,
          admitted_node_ids: Optional[list[str]], avoid: tuple[str, ...]) -> tuple[Optional[PlacementGroup], list]:
    """Scheduling strategies for ``count`` actors of ``bundle`` each (``what``: how an
    error names them), and the placement group holding them (None when pinned).
    Pinned to the usable nodes when the health check admitted some or the plan
    avoids nodes; otherwise a placement group over the whole cluster."""
    if admitted_node_ids is not None or avoid:
        return None, pinned(bundle, count, what, admitted_node_ids, avoid)
    pg = placement_group([dict(bundle) for _ in range(count)], strategy=strategy)
    try:
        ray_cluster.get_while_head_lives([pg.ready()], timeout_s)
    except GetTimeoutError:
        release(pg)
        raise ClusterError(
            f"the cluster could not place {count} {what} of {dict(bundle)} within {timeout_s:.0f} s: "
            f"free resources are {ray.available_resources()}; lower cluster.num_workers or add nodes"
        ) from None
    return pg, [PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=index) for index in range(count)]


def pinned(bundle: Mapping[str, float], count: int, what: str, admitted_node_ids: Optional[list[str]],
           avoid: tuple[str, ...]) -> list:
    """``count`` actors pinned to the usable nodes outside ``avoid``, packed in node
    order by capacity; a :class:`ClusterError` when they cannot hold them."""
    nodes = {node_id: resources for node_id, resources in usable_nodes(admitted_node_ids).items()
             if node_name(node_id) not in avoid}
    slots = [node_id for node_id, fits in slots_of(nodes, bundle).items() for _ in range(min(fits, count))]
    if len(slots) < count:
        raise ClusterError(
            f"the {len(nodes)} usable nodes hold {len(slots)} of the {count} {what} of {dict(bundle)} the plan "
            f"asks for (avoided: {', '.join(avoid) or 'none'})")
    return [NodeAffinitySchedulingStrategy(node_id, soft=False) for node_id in slots[:count]]
