"""Where a sub-run's actors go: shared by the worker groups (one actor per rank
in :mod:`runmgr.workers.group`, one per node in :mod:`runmgr.workers.megatron_group`).

Each actor asks for one bundle; the bundles are placed as the plan says (away
from the nodes it avoids, on the nodes the health check admitted) or a
:class:`ClusterError` says why they cannot be. The node agents' bundles, one per
node, are then reserved all at once on the nodes chosen (:func:`reserve_nodes`).
"""

from __future__ import annotations

from typing import Mapping, Optional

import ray
from ray.exceptions import GetTimeoutError
from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from runmgr import cluster as ray_cluster
from runmgr.config.schema import ClusterConfig, RunConfig
from runmgr.nodes import node_name
from runmgr.dryrun import node_label, node_shortfall
from runmgr.errors import ClusterError
from runmgr.placement import amounts, bundle_for, closest_node, lacking, resolve_device_kind
from runmgr.policy.capacity import slots_of

FREE_NODES_SHOWN = 8
"""Nodes a placement timeout lists with their free resources (the closest to a bundle first)."""
NODE_ID_LABEL = "ray.io/node-id"
"""The label Ray (2.60) gives every node, its node id: a bundle's label selector on it pins the
bundle to that node."""


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


def refuse_unplaceable(config: RunConfig, admitted_node_ids: Optional[list[str]]) -> None:
    """Before the first placement: raise :class:`ClusterError` (one line) when the usable nodes
    cannot hold the run's bundles, each on one node (a rank's, or a Megatron node's
    ``nproc_per_node`` ranks), naming the node that comes closest and what to change."""
    device_kind = resolve_device_kind(config.device, ray.cluster_resources())
    admitted = set(admitted_node_ids) if admitted_node_ids is not None else None
    nodes = {node_label(row): row["Resources"] for row in ray.nodes()
             if row["Alive"] and (admitted is None or row["NodeID"] in admitted)}
    line = node_shortfall(config, nodes, device_kind)
    if line is not None:
        where = "the nodes the health check admitted" if admitted is not None else "the cluster's alive nodes"
        raise ClusterError(f"{config.run.name} cannot be placed on {where}: {line}")


def free_per_node(bundle: Mapping[str, float]) -> str:
    """What each alive node has free of the ``bundle``'s resources, the closest to holding one first."""
    from ray._private.state import available_resources_per_node  # Ray's public API sums over the nodes

    free = available_resources_per_node()
    names = {row["NodeID"]: node_label(row) for row in ray.nodes() if row["Alive"]}
    nodes = {names.get(node_id, node_id[:12]): resources for node_id, resources in free.items()}
    ordered = sorted(nodes, key=lambda name: lacking(bundle, nodes[name]))
    shown = [f"{name}: {amounts(nodes[name], bundle)}" for name in ordered[:FREE_NODES_SHOWN]]
    more = f"; and {len(ordered) - FREE_NODES_SHOWN} more" if len(ordered) > FREE_NODES_SHOWN else ""
    return "; ".join(shown) + more if shown else "no alive node"


def _refuse_if_no_node_holds_one(bundle: Mapping[str, float], count: int, what: str,
                                 nodes: Mapping[str, Mapping[str, float]]) -> None:
    """A :class:`ClusterError` at once, rather than a placement that waits for nothing, when no
    usable node (``nodes``: name -> total resources) can hold one ``bundle``."""
    if any(slots_of(nodes, bundle).values()):
        return
    closest = closest_node(bundle, nodes)
    has = f"the closest, {closest}, has {amounts(nodes[closest], bundle)}" if closest else "there is none"
    raise ClusterError(f"no usable node can hold one of the {count} {what} of {amounts(bundle, bundle)} (each on one "
                       f"node): {has}; lower cluster.cpus_per_worker / cluster.devices_per_worker (or "
                       f"megatron.nproc_per_node), or add such nodes")


def release(pg: Optional[PlacementGroup]) -> None:
    """Remove a placement group, unless the head is gone (asking it would wait for Ray's 60 s)."""
    if pg is not None and not ray_cluster.head_lost():
        remove_placement_group(pg)


def reserve_nodes(counts: Mapping[str, int], bundle: Mapping[str, float], timeout_s: float,
                  replacing: Optional[PlacementGroup]) -> PlacementGroup:
    """One placement group of one bundle per node (``counts``: node id -> how many ``bundle``s
    it gets, summed into its bundle), each pinned to its node by Ray's node-id label: Ray reserves
    all of them at once or none. It is asked for while ``replacing`` (the per-bundle group that
    chose the nodes, None when runmgr pinned them) still holds the room, so it is already in Ray's
    queue when ``replacing`` is released and no Python step lies between the two. A
    :class:`ClusterError` naming the nodes whose room something else took, when it is not
    reserved within ``timeout_s`` (Ray retries it until then)."""
    nodes = list(counts)
    summed = [{key: amount * counts[node] for key, amount in bundle.items()} for node in nodes]
    pg = placement_group(summed, strategy="SPREAD", bundle_label_selector=[{NODE_ID_LABEL: node} for node in nodes])
    release(replacing)
    try:
        ray_cluster.get_while_head_lives([pg.ready()], timeout_s)
    except GetTimeoutError:
        short = short_nodes(dict(zip(nodes, summed)))
        release(pg)
        raise ClusterError(
            f"the nodes chosen for the run could not be reserved within {timeout_s:.0f} s (something else took "
            f"their room after they were chosen): {short}; free the room, or add nodes") from None
    return pg


def short_nodes(wanted: Mapping[str, Mapping[str, float]]) -> str:
    """``node (id): wants CPU 2, GPU 8; free CPU 1, GPU 0`` for each node of ``wanted`` (node id
    -> its bundle) whose free resources cannot hold its bundle now."""
    from ray._private.state import available_resources_per_node  # Ray's public API sums over the nodes

    free = available_resources_per_node()
    names = {row["NodeID"]: node_label(row) for row in ray.nodes()}
    short = [f"{names.get(node, node[:12])}: wants {amounts(bundle, bundle)}; "
             f"free {amounts(free.get(node, {}), bundle)}"
             for node, bundle in wanted.items() if lacking(bundle, free.get(node, {})) > 0]
    return "; ".join(short) or "each has room again now"


def place(bundle: Mapping[str, float], count: int, what: str, strategy: str, timeout_s: float,
          admitted_node_ids: Optional[list[str]], avoid: tuple[str, ...]) -> tuple[Optional[PlacementGroup], list]:
    """Scheduling strategies for ``count`` actors of ``bundle`` each (``what``: how an
    error names them), and the placement group holding them (None when pinned).
    Pinned to the usable nodes when the health check admitted some or the plan
    avoids nodes; otherwise a placement group over the whole cluster."""
    if admitted_node_ids is not None or avoid:
        return None, pinned(bundle, count, what, admitted_node_ids, avoid)
    _refuse_if_no_node_holds_one(bundle, count, what, {node_name(node_id): resources for node_id, resources
                                                       in usable_nodes(None).items()})
    pg = placement_group([dict(bundle) for _ in range(count)], strategy=strategy)
    try:
        ray_cluster.get_while_head_lives([pg.ready()], timeout_s)
    except GetTimeoutError:
        release(pg)
        raise ClusterError(
            f"the cluster could not place {count} {what} of {amounts(bundle, bundle)} (each on one node) within "
            f"{timeout_s:.0f} s; free per node: {free_per_node(bundle)}; lower cluster.num_workers or add nodes"
        ) from None
    return pg, [PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=index) for index in range(count)]


def pinned(bundle: Mapping[str, float], count: int, what: str, admitted_node_ids: Optional[list[str]],
           avoid: tuple[str, ...]) -> list:
    """``count`` actors pinned to the usable nodes outside ``avoid``, packed in node
    order by capacity; a :class:`ClusterError` when they cannot hold them."""
    nodes = {node_id: resources for node_id, resources in usable_nodes(admitted_node_ids).items()
             if node_name(node_id) not in avoid}
    _refuse_if_no_node_holds_one(bundle, count, what, {node_name(node_id): resources
                                                       for node_id, resources in nodes.items()})
    slots = [node_id for node_id, fits in slots_of(nodes, bundle).items() for _ in range(min(fits, count))]
    if len(slots) < count:
        raise ClusterError(
            f"the {len(nodes)} usable nodes hold {len(slots)} of the {count} {what} of {dict(bundle)} the plan "
            f"asks for (avoided: {', '.join(avoid) or 'none'})")
    return [NodeAffinitySchedulingStrategy(node_id, soft=False) for node_id in slots[:count]]


def node_of(strategy: object) -> str:
    """The node id a rank's scheduling strategy puts it on."""
    if isinstance(strategy, NodeAffinitySchedulingStrategy):
        return strategy.node_id
    assert isinstance(strategy, PlacementGroupSchedulingStrategy)
    table = placement_group_table(strategy.placement_group)
    return table["bundles_to_node_id"][strategy.placement_group_bundle_index]
