import pytest

from health.config import FleetChecks
from health.groups import blame, plan_groups, regroup, slow_groups

CHECKS = FleetChecks()


def test_groups_are_pairs_and_a_remainder_joins_the_last():
    assert plan_groups(list("abcdefg")) == [("a", "b"), ("c", "d"), ("e", "f", "g")]
    assert plan_groups(list("abcdef"), size=3) == [("a", "b", "c"), ("d", "e", "f")]
    assert plan_groups(["solo"]) == []
    with pytest.raises(ValueError):
        plan_groups(list("ab"), size=1)


def first_round(slow_pair):
    pairs = plan_groups([f"n{i}" for i in range(8)])
    return {p: (12.0 if p == slow_pair else 40.0 + i / 10) for i, p in enumerate(pairs)}


def test_a_slow_pair_is_found_and_its_members_regrouped_with_healthy_nodes():
    bandwidth = first_round(("n2", "n3"))
    assert slow_groups(bandwidth, CHECKS) == [("n2", "n3")]
    waves = regroup([("n2", "n3")], ["n0", "n1", "n4"])
    assert waves == [[("n2", "n0"), ("n3", "n1")]]
    assert regroup([("a", "b"), ("c", "d")], ["h"]) == [
        [("a", "h")], [("b", "h")], [("c", "h")], [("d", "h")]]


def test_a_node_slow_with_a_healthy_partner_too_is_the_slow_node():
    second = {("n2", "n0"): 40.1, ("n3", "n1"): 11.0}
    result = blame(first_round(("n2", "n3")), second, CHECKS)
    assert list(result.slow_nodes) == ["n3"] and result.slow_links == {}
    assert "healthy n1" in result.slow_nodes["n3"]


def test_two_nodes_fine_apart_but_slow_together_point_at_their_link():
    second = {("n2", "n0"): 40.1, ("n3", "n1"): 39.8}
    result = blame(first_round(("n2", "n3")), second, CHECKS)
    assert result.slow_nodes == {}
    assert "check the path between them" in result.slow_links[("n2", "n3")]


def test_a_fleet_of_equal_pairs_blames_nobody():
    bandwidth = first_round(None)
    assert slow_groups(bandwidth, CHECKS) == []
    assert blame(bandwidth, {}, CHECKS).slow_nodes == {}
