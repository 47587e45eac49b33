"""software-versions reads the health check's report: a package whose version
differs across the admitted nodes is named with each version's nodes."""

from __future__ import annotations

from runmgr.lint.versions import software_versions


def node(node_id, display, **versions):
    return {"node": node_id, "display": display,
            "report": {"facts": {f"software.{k}": v for k, v in versions.items()} | {"cpu.count": 8}}}


def test_a_torch_that_differs_on_one_node_is_named_with_its_node():
    report = {"admitted_node_ids": ["a", "b", "c"], "nodes": [
        node("a", "host-a", torch="2.13.0", ray="2.40.0"), node("b", "host-b", torch="2.13.0", ray="2.40.0"),
        node("c", "host-c", torch="2.1.0", ray="2.40.0")]}
    finding = software_versions(report)
    assert finding.rule == "software-versions" and finding.severity == "warning"
    assert "torch 2.13.0 on host-a, host-b vs 2.1.0 on host-c" in finding.message
    assert "ray" not in finding.message and finding.source.startswith("case report 000")


def test_the_same_stack_everywhere_or_an_excluded_odd_node_is_no_finding():
    same = {"nodes": [node("a", "host-a", torch="2.13.0"), node("b", "host-b", torch="2.13.0")]}
    assert software_versions(same) is None
    excluded = {"admitted_node_ids": ["a"], "nodes": [node("a", "host-a", torch="2.13.0"),
                                                       node("b", "host-b", torch="2.1.0")]}
    assert software_versions(excluded) is None
    assert software_versions({"skipped": True}) is None  # health.skip: no facts to compare
