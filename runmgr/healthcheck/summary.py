"""What a check hands to people and programs: the JSON report (node ids,
verdicts, reasons, figures, collectives, lemons) and the table on screen
(readable node names, lemons called out)."""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping, Optional

from health.fleet import Verdict
from health.report import fleet_report, render_table
from runmgr.healthcheck.exclusions import Lemon
from runmgr.healthcheck.fleet_run import FleetCheck


def k8s_facts(facts: Mapping) -> dict[str, Optional[str]]:
    return {"node_name": facts.get("k8s.node_name"), "pod": facts.get("k8s.pod"),
            "namespace": facts.get("k8s.namespace")}


def build_report(check: FleetCheck, keys: Mapping[str, str], lemons: Mapping[str, Lemon]) -> dict:
    """The check as plain data; ``keys``: node id -> history key, ``lemons``: by key."""
    report = fleet_report(check.reports, check.verdicts, check.started_at)
    nodes = {n.node_id: n for n in check.nodes}
    for entry in report["nodes"]:
        node = nodes[entry["node"]]
        lemon = lemons.get(keys[node.node_id])
        facts = entry["report"]["facts"]
        entry.update(display=node.display(), ray=node.to_dict(), history_key=keys[node.node_id],
                     k8s=k8s_facts(facts), k8s_node=facts.get("k8s.node_name"),
                     lemon=lemon is not None)
    report.update(
        check_id=check.check_id, seconds=round(check.seconds, 3),
        admitted_node_ids=check.admitted_node_ids, notes=list(check.notes),
        collectives=check.collectives.to_dict() if check.collectives else None,
        baseline=dict(check.baseline),
        lemons={node_id: {"key": key, "display": lemons[key].display,
                          "excluded_in": lemons[key].count, "checks": list(lemons[key].checks)}
                for node_id, key in keys.items() if key in lemons})
    return report


def _with_lemon(verdict: Verdict, display: str, lemon: Optional[Lemon]) -> Verdict:
    if lemon is None:
        return replace(verdict, node=display)
    if verdict.verdict == "exclude":
        return replace(verdict, node=display, reasons=(lemon.note(), *verdict.reasons))
    return replace(verdict, node=display, warnings=(*verdict.warnings, lemon.note()))


def render(check: FleetCheck, keys: Mapping[str, str], lemons: Mapping[str, Lemon],
           width: int = 100) -> str:
    """The table a person reads: one block per node, then the tally and notes."""
    names = {n.node_id: n.display() for n in check.nodes}
    verdicts = [_with_lemon(v, names[v.node], lemons.get(keys[v.node])) for v in check.verdicts]
    reports = [replace(r, node=names[r.node]) for r in check.reports]
    title = (f"runmgr health-check {check.check_id}: {len(check.nodes)} node(s) "
             f"checked in {check.seconds:.1f} s")
    lines = [render_table(verdicts, reports, width=width, title=title)]
    lines += check.notes
    return "\n".join(lines)
