"""The table and the JSON report of a check: readable node names, reasons,
and a lemon called a lemon."""

from __future__ import annotations

from health.findings import fail, ok
from health.fleet import decide
from health.config import FleetChecks
from health.node import NodeReport
from runmgr.healthcheck.exclusions import Lemon
from runmgr.healthcheck.fleet_run import FleetCheck
from runmgr.healthcheck.nodes import RayNode, history_keys
from runmgr.healthcheck.summary import build_report, render

NODES = [RayNode("a" * 56, "10.0.0.1", "npu-01"), RayNode("b" * 56, "10.0.0.2", "npu-02")]


def a_check() -> FleetCheck:
    reports = [
        NodeReport(NODES[0].node_id, [ok("devices.ok", "8 NPUs")],
                   {"compute.matmul_tflops": 310.0, "compute.memory_gbps": 1500.0},
                   {"k8s.node_name": "gpu-pool-01"}),
        NodeReport(NODES[1].node_id, [fail("npu.ecc.double_bit", "NPU 3: 2 uncorrectable (double-bit) ECC errors")],
                   {"compute.matmul_tflops": 305.0}),
    ]
    return FleetCheck("20260101T000000Z-7", 0.0, 12.5, NODES, reports, decide(reports, FleetChecks()),
                      notes=["storage: /mnt/hpfs"])


def test_the_table_names_nodes_by_host_and_calls_out_a_lemon():
    check, keys = a_check(), history_keys(NODES)
    lemons = {"host:npu-02": Lemon("host:npu-02", "npu-02 bbbbbbbbbbbb", ("c1", "c2", "c3"), 1.0)}
    lines = render(check, keys, lemons).splitlines()
    assert lines[0] == "runmgr health-check 20260101T000000Z-7: 2 node(s) checked in 12.5 s"
    row = next(line for line in lines if line.startswith("npu-02 bbbbbbbbbbbb"))
    assert "EXCLUDE" in row and "LEMON: excluded in 3 checks" in row
    assert any("double-bit" in line for line in lines)
    assert lines[-2:] == ["2 nodes: 1 admitted, 0 admitted with warnings, 1 excluded", "storage: /mnt/hpfs"]


def test_the_json_report_carries_ids_history_keys_kubernetes_names_and_lemons():
    check, keys = a_check(), history_keys(NODES)
    lemons = {"host:npu-02": Lemon("host:npu-02", "npu-02 bbbbbbbbbbbb", ("c1", "c2", "c3"), 1.0)}
    report = build_report(check, keys, lemons)
    assert report["excluded"] == {"b" * 56: ["NPU 3: 2 uncorrectable (double-bit) ECC errors"]}
    assert report["admitted_node_ids"] == ["a" * 56]
    first = report["nodes"][0]
    assert (first["history_key"], first["k8s_node"], first["lemon"]) == ("host:npu-01", "gpu-pool-01", False)
    assert report["lemons"] == {"b" * 56: {"key": "host:npu-02", "display": "npu-02 bbbbbbbbbbbb",
                                           "excluded_in": 3, "checks": ["c1", "c2", "c3"]}}
