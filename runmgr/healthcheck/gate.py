"""The launch gate: ``runmgr launch`` runs the same checks as ``runmgr
health-check`` before any worker starts (unless ``health.skip=true``, when the
exclusions of the last check still apply), places workers only on admitted
nodes, and records what it decided with the first sub-run."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence, TextIO

from health.config import HealthConfig
from health.findings import Finding
from runmgr.config.schema import RunConfig
from runmgr.errors import ClusterError
from runmgr.healthcheck.exclusions import (
    REPORTS_DIR, CheckRecord, ExclusionStore, NodeRecord, write_json_atomically,
)
from runmgr.healthcheck.fleet_run import FleetCheck, Progress, run_fleet_check
from runmgr.healthcheck.nodes import RayNode, history_keys, rank_nodes
from runmgr.healthcheck.summary import build_report, render

RUN_DIR_REPORTS = "health"
"""Folder of a run directory holding the reports of its launch gates."""


class NoAdmittedNodesError(ClusterError):
    """The health check left no node to run on."""


@dataclass
class HealthGate:
    """What the gate decided for a launch."""

    report: dict
    """The JSON report of the check (a short note when the probes were skipped)."""
    admitted_node_ids: Optional[list[str]]
    """Ray nodes the workers may use; None: no restriction (skipped, nothing excluded)."""
    excluded: dict[str, list[str]]
    """Ray node id -> why it is kept out."""
    report_path: Optional[str] = None

    def evidence(self) -> dict:
        """The short form kept with the sub-run in the logbook."""
        return {"check_id": self.report.get("check_id"), "skipped": bool(self.report.get("skipped")),
                "summary": self.report.get("summary"), "excluded": self.excluded,
                "admitted": self.admitted_node_ids, "lemons": sorted(self.report.get("lemons", {})),
                "report": self.report_path}


def store_for(config: RunConfig) -> ExclusionStore:
    """The exclusion history beside the run directories (``<runs root>/.health``)."""
    return ExclusionStore.for_runs_root(config.run_dir().parent)


def _records(check: FleetCheck, keys: dict[str, str]) -> tuple[NodeRecord, ...]:
    names = {n.node_id: n.display() for n in check.nodes}
    k8s = {r.node: r.facts.get("k8s.node_name") for r in check.reports}
    return tuple(NodeRecord(v.node, keys[v.node], names[v.node], v.verdict, tuple(v.reasons),
                            k8s.get(v.node)) for v in check.verdicts)


def check_and_record(config: HealthConfig, device_kind: str, store: ExclusionStore, source: str,
                     progress: Progress, clock: Callable[[], float] = time.time,
                     nodes: Optional[Sequence[RayNode]] = None,
                     extra_findings: Optional[Mapping[str, list[Finding]]] = None
                     ) -> tuple[FleetCheck, dict, Path]:
    """Run the check, append it to the history, write its report; (check, report, path)."""
    check = run_fleet_check(config, device_kind, progress, clock, nodes,
                            extra_findings=extra_findings)
    keys = history_keys(check.nodes)
    path = store.directory / REPORTS_DIR / f"{check.check_id}.json"
    store.record(CheckRecord(check.check_id, check.started_at, source, _records(check, keys), str(path)))
    report = build_report(check, keys, store.lemons())
    store.save_report(check.check_id, report)
    return check, report, path


def stored_gate(store: ExclusionStore, nodes: Sequence[RayNode]) -> HealthGate:
    """health.skip=true: no probes, but the machines the last check excluded stay out."""
    current = store.current_exclusions()
    keys = history_keys(nodes)
    excluded = {n.node_id: list(current[keys[n.node_id]].reasons) for n in nodes
                if keys[n.node_id] in current}
    admitted = [n.node_id for n in nodes if n.node_id not in excluded] if excluded else None
    report = {"skipped": True, "store": str(store.path), "excluded": excluded,
              "summary": {"nodes": len(nodes), "exclude": len(excluded)}}
    return HealthGate(report, admitted, excluded)


def _progress(out: TextIO) -> Progress:
    def say(line: str) -> None:
        out.write(line + "\n")
        out.flush()
    return say


def preflight_health(config: RunConfig, out: TextIO, clock: Callable[[], float] = time.time) -> HealthGate:
    """Check the connected cluster's nodes for ``config``; raise when none is admitted."""
    import ray

    from runmgr.placement import resolve_device_kind

    store = store_for(config)
    say = _progress(out)
    device_kind = resolve_device_kind(config.device, ray.cluster_resources())
    nodes = rank_nodes(config.cluster, device_kind)
    if config.health.skip:
        gate = stored_gate(store, nodes)
        say(f"health: probes skipped (health.skip=true); {len(gate.excluded)} node(s) kept out "
            f"by the last check in {store.path}")
    else:
        check, report, _ = check_and_record(config.health, device_kind, store, "launch", say, clock, nodes)
        copy = write_json_atomically(config.run_dir() / RUN_DIR_REPORTS / f"{check.check_id}.json", report)
        say(render(check, {r["node"]: r["history_key"] for r in report["nodes"]},
                   store.lemons()))
        gate = HealthGate(report, check.admitted_node_ids, check.excluded,
                          str(copy.relative_to(config.run_dir())))
    if gate.admitted_node_ids == []:
        first = next(iter(gate.excluded.values()), ["?"])
        raise NoAdmittedNodesError(
            f"the health check admitted none of {len(gate.excluded)} node(s) (first: "
            f"{first[0] if first else 'no reason'}): repair them and launch again, or run "
            "`runmgr health-check` to see every reason")
    return gate
