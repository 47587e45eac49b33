import json

from health.findings import Finding, ProbeResult, Severity, at_least, fail, ok, warn, worst
from health.node import NodeReport


def test_worst_severity_and_filtering():
    findings = [ok("a", "fine"), warn("b", "hm"), fail("c", "bad", npu=3)]
    assert worst(findings) is Severity.FAIL and worst([]) is Severity.OK
    assert [f.code for f in at_least(findings, Severity.WARN)] == ["b", "c"]


def test_a_node_report_merges_probes_and_round_trips_through_json():
    report = NodeReport.from_probes("node7", [
        ProbeResult([ok("devices.cpu_only", "cpu only")], facts={"accelerator": "cpu"}),
        ProbeResult([fail("storage.estale", "stale", path="/mnt/nfs")],
                    figures={"storage.write_mbps@/mnt/nfs": 12.5}),
    ], started_at=100.0, seconds=2.5)
    assert report.severity is Severity.FAIL
    data = json.loads(json.dumps(report.to_dict()))
    assert data["severity"] == "fail" and data["findings"][1]["evidence"] == {"path": "/mnt/nfs"}
    assert NodeReport.from_dict(data) == report
    assert Finding.from_dict(data["findings"][1]).severity is Severity.FAIL
