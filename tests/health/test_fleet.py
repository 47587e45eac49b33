import json
import random

import pytest

from health.config import FleetChecks
from health.findings import Severity, fail, warn
from health.fleet import (HOST_FACT, decide, decide_alone, fleet_baseline, host_outliers, outliers,
                          peer_only_reasons, shared_hosts)
from health.node import NodeReport

CHECKS = FleetChecks()
STACK = {"software.python": "3.11.9", "software.torch": "2.13.0", "software.cann": "8.0.RC2",
         "software.torch_npu": "2.13.0"}


def fleet(figures_by_node, facts=None):
    return [NodeReport(node, figures=figures, facts=dict(facts or STACK))
            for node, figures in figures_by_node.items()]


def verdicts(reports, checks=CHECKS):
    return {v.node: v for v in decide(reports, checks)}


def test_one_slow_node_among_six_is_excluded_with_the_figures():
    tflops = [310.2, 305.9, 312.4, 308.8, 199.5, 309.7]
    result = verdicts(fleet({f"node{i}": {"compute.matmul_tflops": t}
                             for i, t in enumerate(tflops)}))
    assert [n for n, v in result.items() if v.verdict == "exclude"] == ["node4"]
    (reason,) = result["node4"].reasons
    assert reason == ("compute.matmul_tflops 199.5 is 35% below the fleet median 309.2 "
                      "(6 nodes)")
    assert all(result[f"node{i}"].verdict == "admit" for i in (0, 1, 2, 3, 5))


@pytest.mark.parametrize("seed", range(20))
def test_ordinary_noise_excludes_nobody(seed):
    rng = random.Random(seed)
    nodes = rng.randint(6, 64)
    reports = fleet({f"n{i}": {"compute.matmul_tflops": rng.gauss(300.0, 6.0),  # 2% sd
                               "storage.latency_ms@/mnt/lustre": rng.gauss(2.0, 0.1)}
                     for i in range(nodes)})
    assert [v.node for v in decide(reports, CHECKS) if v.verdict == "exclude"] == []


def test_a_tight_fleet_does_not_exclude_a_node_a_little_off():
    # MAD is 0: any difference is "many sigmas", the relative floor keeps it fair.
    values = {"a": 100.0, "b": 100.0, "c": 100.0, "d": 100.0, "e": 96.0}
    assert outliers(values, "compute.memory_gbps", True, CHECKS) == []
    (warned,) = outliers({**values, "e": 92.0}, "compute.memory_gbps", True, CHECKS)
    assert warned.severity is Severity.WARN


def test_lower_is_better_figures_exclude_the_high_one_per_mount():
    reports = fleet({f"n{i}": {"storage.latency_ms@/mnt/lustre": 2.0 + i / 100,
                               "storage.latency_ms@/mnt/nfs": 5.0} for i in range(5)})
    reports[2].figures["storage.latency_ms@/mnt/lustre"] = 9.0
    result = verdicts(reports)
    assert result["n2"].verdict == "exclude"
    assert "storage.latency_ms@/mnt/lustre 9 is" in result["n2"].reasons[0]
    assert "above the fleet median" in result["n2"].reasons[0]


def test_too_few_peers_means_no_judgement():
    assert outliers({"a": 100.0, "b": 10.0}, "compute.matmul_tflops", True, CHECKS) == []


def test_findings_decide_exclusion_and_warnings():
    reports = fleet({"a": {}, "b": {}, "c": {}})
    reports[0].findings.append(fail("npu.ecc.double_bit", "NPU 3: 2 uncorrectable ECC errors"))
    reports[1].findings.append(warn("gpu.xid.94", "GPU 0000:01:00: Xid 94"))
    result = verdicts(reports)
    assert (result["a"].verdict, result["a"].reasons) == (
        "exclude", ("NPU 3: 2 uncorrectable ECC errors",))
    assert (result["b"].verdict, result["b"].warnings) == ("warn", ("GPU 0000:01:00: Xid 94",))
    assert result["c"].verdict == "admit"


def test_a_node_off_the_majority_stack_is_excluded():
    reports = fleet({f"n{i}": {} for i in range(6)})
    reports[3].facts["software.torch_npu"] = "2.1.0.post8"
    reports[5].facts["software.cann"] = None  # CANN missing on that node
    result = verdicts(reports)
    assert result["n3"].reasons == (
        "torch_npu 2.1.0.post8 differs from the fleet's 2.13.0 (5 of 6 nodes): align the stack",)
    assert "cann absent differs from the fleet's 8.0.RC2" in result["n5"].reasons[0]
    assert result["n0"].verdict == "admit"
    lenient = verdicts(reports, FleetChecks(software_mismatch="warn"))
    assert lenient["n3"].verdict == "warn"


def test_no_majority_stack_warns_everyone():
    reports = fleet({f"n{i}": {} for i in range(4)})
    for report in reports[:2]:
        report.facts["software.torch"] = "2.12.0"
    result = verdicts(reports)
    assert {v.verdict for v in result.values()} == {"warn"}
    assert "no majority torch version" in result["n0"].warnings[0]


def test_nodes_without_a_software_report_are_not_compared():
    reports = fleet({f"n{i}": {} for i in range(3)})
    reports.append(NodeReport("bare"))
    assert verdicts(reports)["bare"].verdict == "admit"


# --- Nodes that share a machine (issue 27, item 4) ---------------------------------------------

def hosted(rows):
    """``[(node, host or None, tflops), ...]`` -> reports; host None: the node says nothing."""
    return [NodeReport(node, figures={"compute.matmul_tflops": value},
                       facts={**STACK, **({HOST_FACT: host} if host else {})})
            for node, host, value in rows]


def speed_exclusions(reports, checks=CHECKS):
    return {v.node: v.reasons for v in decide(reports, checks) if v.verdict == "exclude"}


@pytest.mark.parametrize("case, rows, excluded", [
    # Every node on one loaded machine, figures 15-49% apart (as measured beside two busy loops):
    # they compete for the same cores, so none is excluded for speed.
    ("one host, one node 33% below two equal ones",
     [("a", "vm", 0.090), ("b", "vm", 0.090), ("c", "vm", 0.060)], set()),
    ("one host, spread 15-49%",
     [("a", "vm", 0.0908), ("b", "vm", 0.0464), ("c", "vm", 0.0508), ("d", "vm", 0.0771)], set()),
    ("one host of six, one node capped to a twentieth",
     [(f"n{i}", "vm", 1.0) for i in range(5)] + [("slow", "vm", 0.05)], set()),
    # Every node on a machine of its own: the rule as it always was.
    ("own hosts, one slow", [(f"n{i}", f"h{i}", v) for i, v in enumerate([310.2, 305.9, 312.4, 199.5])], {"n3"}),
    ("no host facts, one slow", [(f"n{i}", None, v) for i, v in enumerate([310.2, 305.9, 312.4, 199.5])], {"n3"}),
    # A slow node alone on its machine is still excluded beside a machine of several nodes.
    ("mixed, the lone slow machine",
     [("a1", "A", 300.0), ("a2", "A", 240.0), ("a3", "A", 300.0), ("b", "B", 305.0), ("c", "C", 298.0),
      ("d", "D", 150.0)], {"d"}),
    # A node slower than its neighbours on one machine: not independent, warned only.
    ("mixed, the slow node shares its machine",
     [("a1", "A", 300.0), ("a2", "A", 300.0), ("a3", "A", 150.0), ("b", "B", 305.0), ("c", "C", 298.0)],
     set()),
    # A whole machine slow against the others: every node on it is excluded.
    ("mixed, a slow machine of two nodes",
     [("a1", "A", 150.0), ("a2", "A", 152.0), ("b", "B", 305.0), ("c", "C", 298.0), ("d", "D", 301.0)],
     {"a1", "a2"}),
    # Two machines cannot outvote each other, however many nodes they hold.
    ("two machines", [("a1", "A", 300.0), ("a2", "A", 300.0), ("a3", "A", 300.0), ("b", "B", 100.0)], set()),
])
def test_nodes_that_share_a_machine_are_not_excluded_for_speed_against_each_other(case, rows, excluded):
    assert set(speed_exclusions(hosted(rows))) == excluded, case


def test_the_plain_rule_would_have_excluded_a_node_of_a_loaded_machine():
    """What went wrong before: judged node by node, a node of a loaded machine is 'slow'."""
    rows = [("a", "vm", 0.090), ("b", "vm", 0.090), ("c", "vm", 0.060)]
    assert [o.node for o in outliers({n: v for n, _, v in rows}, "compute.matmul_tflops", True, CHECKS)] == ["c"]
    assert speed_exclusions(hosted(rows)) == {}


def test_the_reasons_say_which_comparison_was_made():
    rows = [("a1", "A", 300.0), ("a2", "A", 300.0), ("a3", "A", 150.0), ("b", "B", 305.0), ("c", "C", 298.0),
            ("d", "D", 150.0)]
    result = verdicts(hosted(rows))
    (reason,) = result["d"].reasons
    # Hosts A (its nodes' median 300), B, C and D: the fleet median is 299, not the nodes' 300.
    assert reason == ("compute.matmul_tflops 150 is 50% below the fleet median 299 (4 hosts; nodes that "
                      "share a host count as one)")
    assert result["a3"].verdict == "warn" and result["a3"].reasons == ()
    (warning,) = result["a3"].warnings
    assert "50% below the median 300 of the 3 nodes on its host" in warning and "not independent" in warning
    slow_machine = verdicts(hosted([("a1", "A", 150.0), ("a2", "A", 152.0), ("b", "B", 305.0),
                                    ("c", "C", 298.0), ("d", "D", 301.0)]))
    assert "151 (the median of the 2 nodes on its host) is 50% below" in slow_machine["a1"].reasons[0]


def test_host_outliers_is_the_plain_rule_when_no_machine_is_shared():
    rng = random.Random(7)
    values = {f"n{i}": rng.gauss(100.0, 3.0) for i in range(40)}
    values.update(slow=50.0, slower=20.0, lagging=91.0)
    hosts = {n: f"h-{n}" for n in values}
    assert host_outliers(values, hosts, "compute.memory_gbps", True, CHECKS) == \
        outliers(values, "compute.memory_gbps", True, CHECKS) != []


def test_shared_hosts_lists_machines_of_several_nodes():
    reports = hosted([("a1", "A", 1.0), ("a2", "A", 1.0), ("b", "B", 1.0), ("x", None, 1.0)])
    assert shared_hosts(reports) == {"host:A": ["a1", "a2"]}


# --- Judging a node alone against the fleet's figures kept at exclusion (item 3) ----------------

def test_the_baseline_keeps_what_the_fleet_judged_with():
    rows = [("a1", "A", 300.0), ("a2", "A", 100.0), ("a3", "A", 300.0), ("b", "B", 310.0), ("c", "C", 290.0)]
    reports = hosted(rows)
    reports[1].facts["software.torch"] = "2.12.0"
    for r in reports:
        r.figures["storage.write_mbps@/mnt/x"] = 500.0  # only on A and B: too few hosts to judge
    del reports[4].figures["storage.write_mbps@/mnt/x"]
    baseline = fleet_baseline(reports, CHECKS)
    figure = baseline["figures"]["compute.matmul_tflops"]
    assert figure["median"] == 300.0 and figure["hosts"] == 3  # A counted once, by its median (300)
    assert figure["sigma"] == pytest.approx(1.4826 * 10.0)
    assert "storage.write_mbps@/mnt/x" not in baseline["figures"]
    assert baseline["software"]["torch"] == "2.13.0" and baseline["software"]["cann"] == "8.0.RC2"
    assert (baseline["nodes"], baseline["hosts"]) == (5, 3)
    assert json.loads(json.dumps(baseline)) == baseline


BASELINE = {"figures": {"compute.matmul_tflops": {"median": 300.0, "sigma": 6.0, "hosts": 8},
                        "storage.latency_ms@/mnt/lustre": {"median": 2.0, "sigma": 0.1, "hosts": 8}},
            "software": {"torch": "2.13.0", "cann": "8.0.RC2"}, "check": "20260101T000000Z-1",
            "nodes": 8, "hosts": 8, "needs_peers": []}


def alone(tflops, latency=2.0, torch="2.13.0", findings=()):
    return NodeReport("gpu-07", list(findings),
                      figures={"compute.matmul_tflops": tflops, "storage.latency_ms@/mnt/lustre": latency},
                      facts={**STACK, "software.torch": torch})


@pytest.mark.parametrize("case, report, baseline, verdict, says", [
    ("repaired: as fast as the fleet was", alone(296.0), BASELINE, "admit", None),
    ("still slow: the same rule as in the fleet", alone(240.0), BASELINE, "exclude",
     "compute.matmul_tflops 240 is 20% below the fleet median 300 kept when it was excluded "
     "(20260101T000000Z-1) (8 hosts)"),
    ("a little slow: warned", alone(275.0), BASELINE, "warn", "8% below the fleet median 300"),
    ("slow storage, lower is better", alone(300.0, latency=3.0), BASELINE, "exclude",
     "storage.latency_ms@/mnt/lustre 3 is 50% above the fleet median 2"),
    ("off the fleet's stack", alone(300.0, torch="2.12.0"), BASELINE, "exclude",
     "torch 2.12.0 differs from the fleet's 2.13.0 when it was excluded"),
    ("a failing probe", alone(300.0, findings=[fail("npu.ecc.double_bit", "NPU 3: 2 uncorrectable ECC errors")]),
     BASELINE, "exclude", "NPU 3: 2 uncorrectable ECC errors"),
    ("excluded for its collectives: only peers can tell",
     alone(300.0), {**BASELINE, "needs_peers": ["all-reduce with healthy b reaches 1 GB/s"]}, "exclude",
     "cannot measure (all-reduce with healthy b reaches 1 GB/s)"),
    ("no baseline kept: speed not compared", alone(10.0), None, "warn",
     "no fleet baseline was kept for this node"),
])
def test_a_node_checked_alone_is_judged_against_the_kept_baseline(case, report, baseline, verdict, says):
    result = decide_alone(report, baseline, CHECKS)
    assert result.verdict == verdict, (case, result)
    if says:
        assert any(says in line for line in result.reasons + result.warnings), (case, result)


def test_peer_only_reasons_are_the_collectives_ones():
    report = NodeReport("n", [fail("collectives.slow_node", "all-reduce with healthy b reaches 1 GB/s"),
                              fail("storage.missing", "/mnt/x: ENOENT")])
    reasons = ["all-reduce with healthy b reaches 1 GB/s", "/mnt/x: ENOENT",
               "collectives.busbw_gbps 1 is 90% below the fleet median 10 (4 nodes)",
               "compute.matmul_tflops 1 is 90% below the fleet median 10 (4 nodes)"]
    assert peer_only_reasons(report, reasons) == [reasons[0], reasons[2]]
