import random

import pytest

from health.config import FleetChecks
from health.findings import Severity, fail, warn
from health.fleet import decide, outliers
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
