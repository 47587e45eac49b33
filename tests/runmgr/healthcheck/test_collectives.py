"""Group tests: the rounds tell a slow node from a slow link and a broken
node from a broken path (measurements injected, the order of rounds is what
is tested), and a real pair of Ray actors measures gloo all-reduce."""

from __future__ import annotations

from health.config import CollectiveChecks, FleetChecks
from health.findings import Severity
from runmgr.healthcheck.collectives import FIGURE, RayMeasure, collective_results, collective_rounds

CHECKS = CollectiveChecks(group_size=2)
FLEET = FleetChecks()
NODES = ["n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8"]


class Links:
    """Bandwidth of a group: its slowest member's link, or a slow pair's path."""

    def __init__(self, slow_nodes=(), slow_pairs=(), broken=()):
        self.slow_nodes, self.slow_pairs, self.broken = set(slow_nodes), set(slow_pairs), set(broken)
        self.calls: list[list[tuple[str, ...]]] = []

    def __call__(self, groups):
        self.calls.append(list(groups))
        measured, failed = {}, {}
        for g in groups:
            if set(g) & self.broken:
                measured[g], failed[g] = 0.0, "Connection closed by peer"
            elif set(g) & self.slow_nodes or frozenset(g) in self.slow_pairs:
                measured[g] = 1.0
            else:
                measured[g] = 10.0 + 0.1 * len(self.calls)
        return measured, failed


def severities(outcome, code):
    return {node: f.severity for node, r in collective_results(outcome).items()
            for f in r.findings if f.code == code}


def test_a_slow_node_is_slow_with_a_healthy_partner_too():
    links = Links(slow_nodes={"n3"})
    outcome = collective_rounds(NODES, links, CHECKS, FLEET)
    assert links.calls[0] == [("n1", "n2"), ("n3", "n4"), ("n5", "n6"), ("n7", "n8")]
    assert [g[0] for g in links.calls[1]] == ["n3", "n4"]  # both suspects re-paired
    assert list(outcome.blame.slow_nodes) == ["n3"]
    assert severities(outcome, "collectives.slow_node") == {"n3": Severity.FAIL}
    figures = {n: r.figures[FIGURE] for n, r in collective_results(outcome).items()}
    assert figures["n3"] == 1.0 and figures["n4"] > 10


def test_a_slow_path_between_two_good_nodes_warns_both_and_excludes_neither():
    outcome = collective_rounds(NODES, Links(slow_pairs={frozenset({"n5", "n6"})}), CHECKS, FLEET)
    assert outcome.blame.slow_nodes == {} and list(outcome.blame.slow_links) == [("n5", "n6")]
    assert severities(outcome, "collectives.slow_link") == {"n5": Severity.WARN, "n6": Severity.WARN}


def test_a_node_that_cannot_all_reduce_with_anyone_fails_and_its_partner_is_cleared():
    outcome = collective_rounds(NODES, Links(broken={"n7"}), CHECKS, FLEET)
    assert ("n7", "n8") in outcome.failed
    assert severities(outcome, "collectives.failed") == {"n7": Severity.FAIL}
    assert "n8" not in severities(outcome, "collectives.failed")


def test_a_failed_pair_with_no_healthy_node_left_is_a_warning_on_both():
    outcome = collective_rounds(["n1", "n2"], Links(broken={"n2"}), CHECKS, FLEET)
    assert severities(outcome, "collectives.unattributed") == {"n1": Severity.WARN, "n2": Severity.WARN}
    assert FIGURE not in collective_results(outcome)["n1"].figures


def test_two_actors_form_a_real_gloo_group_and_measure_it(local_ray):
    node = local_ray.get_runtime_context().get_node_id()
    measure = RayMeasure([node], "cpu", CollectiveChecks(megabytes=1.0, iterations=2, timeout_s=30))
    measure.members["twin"] = measure._member(node)  # a second member on the same node
    try:
        measured, failed = measure([(node, "twin")])
    finally:
        measure.close()
    assert failed == {}
    assert measured[(node, "twin")] > 0.0


def test_on_one_machine_a_slow_node_of_the_collectives_is_warned_not_excluded():
    """Eight Ray nodes on one busy machine: the slow pair's member is slow beside nodes that
    share its cores, not a slow node. On machines of their own it is excluded."""
    from health.fleet import HOST_FACT, decide
    from health.config import HealthConfig
    from health.node import NodeReport
    from runmgr.healthcheck.fleet_run import run_collectives

    config = HealthConfig(collectives=CHECKS)
    for same, expected in [(True, "warn"), (False, "exclude")]:
        reports = [NodeReport(n, facts={HOST_FACT: "vm" if same else n}) for n in NODES]
        run_collectives(reports, decide(reports, FLEET), config, "cpu", lambda line: None,
                        Links(slow_nodes={"n3"}))
        verdict = {v.node: v for v in decide(reports, FLEET)}["n3"]
        assert verdict.verdict == expected, (same, verdict)
        if same:
            assert "not independent" in verdict.warnings[0]
