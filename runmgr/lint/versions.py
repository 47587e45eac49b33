"""software-versions: the software stack that differs across the nodes the
health check admitted (seed 000: mismatched DeepSpeed, Megatron-LM, CANN and
torch_npu versions were taken for an unstable NPU). A pure function of the
health check's JSON report (``runmgr health-check --json``, the launch gate's)."""

from __future__ import annotations

from collections import defaultdict
from typing import Mapping, Optional

from runmgr.lint.findings import Finding
from runmgr.lint.rules import RULES

SOFTWARE = "software."
"""Prefix of the version facts the software probe reports (health/probes/software.py)."""


def node_versions(report: Mapping) -> dict[str, dict[str, str]]:
    """Node display name -> {package: version}, for the nodes the check admitted."""
    admitted = report.get("admitted_node_ids")
    out = {}
    for entry in report.get("nodes", []):
        if admitted is not None and entry.get("node") not in admitted:
            continue
        facts = entry.get("report", {}).get("facts", {})
        name = entry.get("display") or entry.get("node", "?")
        out[name] = {key[len(SOFTWARE):]: str(value) for key, value in facts.items()
                     if key.startswith(SOFTWARE) and value is not None}
    return out


def differing_versions(versions: Mapping[str, Mapping[str, str]]) -> dict[str, dict[str, list[str]]]:
    """Package -> {version: [nodes]} for every package with more than one version."""
    by_package: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for node, packages in versions.items():
        for package, version in packages.items():
            by_package[package][version].append(node)
    return {package: {v: sorted(nodes) for v, nodes in seen.items()}
            for package, seen in sorted(by_package.items()) if len(seen) > 1}


def software_versions(report: Mapping) -> Optional[Finding]:
    differing = differing_versions(node_versions(report))
    if not differing:
        return None
    parts = [f"{package} " + " vs ".join(f"{version} on {', '.join(nodes)}" for version, nodes in seen.items())
             for package, seen in differing.items()]
    return RULES["software-versions"].finding(
        f"software versions differ across the nodes: {'; '.join(parts)}",
        "install the same versions on every node (the health check's report lists each node's), or exclude "
        "the odd nodes")
