import json

from health.config import FleetChecks
from health.findings import fail, ok, warn
from health.fleet import decide
from health.node import NodeReport
from health.report import excluded_nodes, fleet_report, key_figures, render_table


def sample_fleet():
    reports = [NodeReport(f"npu-node-{i:02d}.cluster.local",
                          figures={"compute.matmul_tflops": 300.0 + i,
                                   "compute.memory_gbps": 1500.0,
                                   "storage.write_mbps@/mnt/lustre": 900.0,
                                   "storage.write_mbps@/mnt/nfs": 450.0 + i},
                          facts={"software.torch": "2.13.0"})
               for i in range(6)]
    reports[1].findings += [
        fail("npu.ecc.double_bit", "NPU 3: 2 uncorrectable (double-bit) ECC errors since boot "
             "(hbm double bit error count): memory is corrupt, drain the node and reboot it, "
             "replace the NPU if they return"),
        fail("roce.link.down", "RoCE link of device 4 is DOWN: check the cable, optics and "
             "switch port (hccn_tool -i 4 -link_stat -g shows its history)")]
    reports[2].findings.append(warn("gpu.xid.94", "GPU 0000:01:00: Xid 94: contained ECC error"))
    reports[3].findings.append(ok("storage.ok", "all good"))
    reports[4].figures["compute.matmul_tflops"] = 150.0
    return reports, decide(reports, FleetChecks())


def test_the_fleet_report_is_json_and_carries_the_exclusion_list():
    reports, verdicts = sample_fleet()
    report = json.loads(json.dumps(fleet_report(reports, verdicts, generated_at=1234.5)))
    assert report["summary"] == {"nodes": 6, "admit": 3, "warn": 1, "exclude": 2}
    assert excluded_nodes(report) == ["npu-node-01.cluster.local", "npu-node-04.cluster.local"]
    assert len(report["excluded"]["npu-node-01.cluster.local"]) == 2
    node = report["nodes"][1]
    assert node["verdict"] == "exclude" and node["report"]["severity"] == "fail"
    assert NodeReport.from_dict(node["report"]) == reports[1]


def test_the_table_fits_100_columns_and_names_every_node_verdict_and_reason():
    reports, verdicts = sample_fleet()
    table = render_table(verdicts, reports, title="health-check run12")
    lines = table.splitlines()
    assert max(len(line) for line in lines) <= 100
    assert lines[0] == "health-check run12"
    for verdict in verdicts:
        assert any(line.startswith(verdict.node[:17]) and verdict.verdict.upper() in line
                   for line in lines)
    text = " ".join(line.strip() for line in lines)
    assert "memory is corrupt" in text and "RoCE link of device 4 is DOWN" in text
    assert "(warn) GPU 0000:01:00: Xid 94" in text
    assert "compute.matmul_tflops 150 is" in text
    assert lines[-1] == "6 nodes: 3 admitted, 1 admitted with warnings, 2 excluded"


def test_key_figures_show_the_worst_mount():
    assert key_figures({"compute.matmul_tflops": 312.44, "compute.memory_gbps": 1520.0,
                        "storage.write_mbps@/a": 900.0, "storage.write_mbps@/b": 451.0}) == \
        "312 TF/s 1520 GB/s w 451 MB/s"
    assert key_figures({"compute.matmul_tflops": 0.04123}) == "0.0412 TF/s"
    assert key_figures({}) == "-"
