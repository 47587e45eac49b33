"""Placing a sub-run's actors: a bundle no usable node can hold is a ClusterError at once
(naming the node that comes closest), not a placement group that waits for nothing."""

from __future__ import annotations

import pytest

from runmgr.errors import ClusterError
from runmgr.workers.placing import _refuse_if_no_node_holds_one


def test_a_bundle_no_node_holds_is_refused_at_once_naming_the_closest():
    nodes = {"3f2a9c1b0d4e": {"CPU": 1.0}, "9b8c7d6e5f4a": {"CPU": 1.5}}
    with pytest.raises(ClusterError) as caught:
        _refuse_if_no_node_holds_one({"CPU": 2.0}, 1, "nodes", nodes)
    said = str(caught.value)
    assert said.startswith("no usable node can hold one of the 1 nodes of CPU 2 (each on one node): the closest, "
                           "9b8c7d6e5f4a, has CPU 1.5")
    assert "\n" not in said


def test_a_bundle_one_node_holds_goes_on_to_placement():
    _refuse_if_no_node_holds_one({"CPU": 2.0}, 2, "nodes", {"a": {"CPU": 1.0}, "b": {"CPU": 2.0}})


def test_a_placement_that_times_out_says_what_each_node_has_free(local_ray):
    from runmgr.workers.placing import place

    free = local_ray.available_resources().get("CPU", 0.0)
    # One bundle fits a node, all of them never do: the timeout's length decides nothing, 1 s is only
    # how long the test waits for it (2 s before).
    with pytest.raises(ClusterError) as caught:
        place({"CPU": 1.0}, int(free) + 1, "ranks", "PACK", 1.0, None, ())
    said = str(caught.value)
    assert f"could not place {int(free) + 1} ranks of CPU 1 (each on one node) within 1 s; free per node: " in said
    node = local_ray.nodes()[0]
    assert f"{node['NodeManagerAddress']} ({node['NodeID'][:12]}): CPU " in said  # per node, not summed


def test_nodes_whose_room_something_else_took_are_named_when_their_reservation_waits_out(local_ray):
    """The agents' per-node group (reserve_nodes) waits while another holder keeps a node's room,
    and then says which node, what it wants and what is free there, in one line; it leaves no group."""
    from ray.util.placement_group import placement_group, placement_group_table

    from runmgr.workers.placing import release, reserve_nodes

    def held_groups() -> set[str]:
        return {pg["placement_group_id"] for pg in placement_group_table().values() if pg["state"] != "REMOVED"}

    node = local_ray.nodes()[0]
    whole = {"CPU": node["Resources"]["CPU"]}
    other = placement_group([{"CPU": 0.5}], bundle_label_selector=[{"ray.io/node-id": node["NodeID"]}])
    try:
        local_ray.get(other.ready(), timeout=60)
        # The whole node can never be reserved while the other group holds half a CPU of it: the
        # timeout's length decides nothing, 1 s is only how long the test waits.
        before = held_groups()
        with pytest.raises(ClusterError) as caught:
            reserve_nodes({node["NodeID"]: 1}, whole, 1.0, replacing=None)
        assert held_groups() == before  # the waiting group went with its refusal
    finally:
        release(other)
    said = str(caught.value)
    assert said.startswith("the nodes chosen for the run could not be reserved within 1 s (something else took "
                           "their room after they were chosen): ")
    assert f"{node['NodeManagerAddress']} ({node['NodeID'][:12]}): wants CPU {whole['CPU']:g}; free CPU " in said
    assert "\n" not in said
