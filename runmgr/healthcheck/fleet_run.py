"""The whole check on a Ray cluster: the node probes on every node at once
(one task each, pinned to its node, bounded), the fleet's first verdicts,
the collective tests among the nodes still in, and the final verdicts.

Progress goes to a callback (one line per event) so that a person watching
sees the check move; nothing here prints.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from itertools import zip_longest
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Sequence

from health.config import HealthConfig
from health.findings import Finding, ProbeResult, Severity, fail, warn
from health.fleet import NOT_INDEPENDENT, Verdict, decide, fleet_baseline, host_of, shared_hosts
from health.node import NodeReport
from runmgr.errors import ClusterError
from runmgr.healthcheck.collectives import (
    CollectiveOutcome, Measure, collective_results, measure_collectives,
)
from runmgr.healthcheck.nodes import RayNode, alive_nodes
from runmgr.healthcheck.node_task import compute_on_this_node, probe_this_node

Progress = Callable[[str], None]
Clock = Callable[[], float]
Gather = Callable[[Sequence[RayNode], HealthConfig, Progress], list[NodeReport]]
"""Every node's probes: their reports, in the nodes' order."""


@dataclass
class FleetCheck:
    """One whole check: who was looked at, what they said, what was decided."""

    check_id: str
    """Unique name of this check (UTC time and driver pid)."""
    started_at: float
    seconds: float
    nodes: list[RayNode]
    reports: list[NodeReport]
    verdicts: list[Verdict]
    collectives: Optional[CollectiveOutcome] = None
    """None when the group tests did not run (disabled, or fewer than two nodes)."""
    notes: list[str] = field(default_factory=list)
    """What a person should know about the check itself (e.g. collectives skipped)."""
    baseline: dict = field(default_factory=dict)
    """The fleet's figures as judged (health.fleet.fleet_baseline): kept on an excluded
    Kubernetes node, so that it can be re-checked alone against them later."""

    @property
    def admitted_node_ids(self) -> list[str]:
        return [v.node for v in self.verdicts if v.verdict != "exclude"]

    @property
    def excluded(self) -> dict[str, list[str]]:
        return {v.node: list(v.reasons) for v in self.verdicts if v.verdict == "exclude"}


def new_check_id(now: float) -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now)) + f"-{os.getpid()}"


def _failed_report(node: RayNode, code: str, message: str) -> NodeReport:
    return NodeReport(node.node_id, [fail(code, message, node=node.display())],
                      facts={"node.hostname": node.hostname})


def _first_reason(report: NodeReport) -> str:
    failing = [f.message for f in report.findings if f.severity is Severity.FAIL]
    return f"FAIL {failing[0]}" if failing else "ok"


def _collect(ref, node: RayNode) -> NodeReport:
    import ray
    from ray.exceptions import RayError, RayTaskError

    try:
        return NodeReport.from_dict(ray.get(ref))
    except RayTaskError as exc:
        lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
        return _failed_report(node, "health.probe_error",
                              f"the probes crashed on this node: {lines[-1].strip() if lines else exc}")
    except RayError as exc:  # the worker or the node died under the probes
        return _failed_report(node, "health.node_lost",
                              f"the node stopped answering during the probes: {type(exc).__name__}")


def gather_node_reports(nodes: Sequence[RayNode], config: HealthConfig, progress: Progress,
                        clock: Clock = time.monotonic) -> list[NodeReport]:
    """Probe every node at once; a node silent past ``node_timeout_s`` fails."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    # num_cpus=0: a probe must run even where the run's workers hold every CPU.
    task = ray.remote(num_cpus=0, max_retries=0)(probe_this_node)
    refs = {task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n.node_id, soft=False))
            .remote(config, n.node_id, False): n for n in nodes}
    deadline = clock() + config.node_timeout_s
    reports: dict[str, NodeReport] = {}
    pending = list(refs)
    while pending and clock() < deadline:
        done, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, deadline - clock()))
        for ref in done:
            node = refs[ref]
            report = reports[node.node_id] = _collect(ref, node)
            progress(f"  [{len(reports)}/{len(nodes)}] {node.display()}  "
                     f"{report.seconds:.1f} s  {_first_reason(report)}")
    for ref in pending:
        node = refs[ref]
        ray.cancel(ref, force=True)
        reports[node.node_id] = _failed_report(
            node, "health.node_timeout",
            f"the node's probes did not finish within health.node_timeout_s="
            f"{config.node_timeout_s:g} s: the node is hung or overloaded; drain it")
        progress(f"  [{len(reports)}/{len(nodes)}] {node.display()}  no answer within "
                 f"{config.node_timeout_s:g} s")
    answered = [n for n in nodes if not any(f.code == "health.node_timeout" for f in reports[n.node_id].findings)]
    benchmark_compute(answered, reports, config, clock)
    return [reports[n.node_id] for n in nodes]


def benchmark_compute(nodes: Sequence[RayNode], reports: dict[str, NodeReport], config: HealthConfig,
                      clock: Clock = time.monotonic) -> None:
    """The compute benchmark, after every node's other probes: one node per
    host at a time (rounds), all hosts at once, so nodes sharing a machine are
    never measured while another one works or starts up beside them. The
    machine is the kernel's boot id (pods on one machine have host names of
    their own but share it), else the host name."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    # max_calls=1: the worker exits after the benchmark. Kept alive as an idle
    # worker it would hold its device context and cached memory (852 MiB on an
    # H100) beside the run's rank for the whole run.
    task = ray.remote(num_cpus=0, max_retries=0, max_calls=1)(compute_on_this_node)
    by_host: dict[str, list[RayNode]] = {}
    for node in nodes:
        facts = reports[node.node_id].facts
        host = facts.get("node.boot_id") or facts.get("node.hostname") or node.node_id
        by_host.setdefault(str(host), []).append(node)
    for round_nodes in zip_longest(*by_host.values()):
        refs = {task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n.node_id, soft=False))
                .remote(config): n for n in round_nodes if n is not None}
        done, pending = ray.wait(list(refs), num_returns=len(refs), timeout=config.node_timeout_s)
        for ref in done:
            try:
                result = ray.get(ref)
            except ray.exceptions.RayError as exc:
                result = ProbeResult([fail("compute.error", f"the compute benchmark failed: {type(exc).__name__}")])
            report = reports[refs[ref].node_id]
            report.findings.extend(result.findings)
            report.figures.update(result.figures)
        for ref in pending:
            ray.cancel(ref, force=True)
            reports[refs[ref].node_id].findings.append(fail(
                "compute.timeout", f"the compute benchmark did not finish within {config.node_timeout_s:g} s"))


def run_collectives(reports: list[NodeReport], verdicts: list[Verdict], config: HealthConfig,
                    device_kind: str, progress: Progress,
                    measure: Optional[Measure] = None) -> tuple[Optional[CollectiveOutcome], list[str]]:
    """Group tests among the nodes the node probes kept; folds results into the reports."""
    if not config.collectives.enabled:
        return None, ["collectives: disabled (health.collectives.enabled=false)"]
    candidates = [v.node for v in verdicts if v.verdict != "exclude"]
    if len(candidates) < 2:
        return None, [f"collectives: skipped, {len(candidates)} node(s) passed the node probes "
                      "(a group needs two)"]
    progress(f"collectives: all-reduce in groups of {config.collectives.group_size} over "
             f"{len(candidates)} nodes ({device_kind})")
    outcome = measure_collectives(candidates, device_kind, config.collectives, config.fleet, measure)
    by_node = {r.node: r for r in reports}
    one_machine = len({host_of(by_node[n]) for n in candidates}) == 1
    for node, result in collective_results(outcome).items():
        report = by_node[node]
        report.findings.extend(not_judged_on_one_machine(result.findings) if one_machine else result.findings)
        report.figures.update(result.figures)
    progress(f"collectives: {len(outcome.first)} groups, {len(outcome.second)} re-pairings, "
             f"{len(outcome.failed)} failed")
    return outcome, []


def not_judged_on_one_machine(findings: Sequence[Finding]) -> list[Finding]:
    """The collectives' findings of nodes that all share one machine: "slow with a healthy
    partner" compares nodes that compete for the same cores and memory, so it warns only
    (an all-reduce that fails outright still fails the node)."""
    return [warn(f.code, f"{f.message} ({NOT_INDEPENDENT})", **f.evidence)
            if f.severity is Severity.FAIL and f.code == "collectives.slow_node" else f for f in findings]


def run_fleet_check(config: HealthConfig, device_kind: str, progress: Progress,
                    clock: Clock = time.time, nodes: Optional[Sequence[RayNode]] = None,
                    measure: Optional[Measure] = None,
                    extra_findings: Optional[Mapping[str, list[Finding]]] = None,
                    gather: Optional[Gather] = None) -> FleetCheck:
    """The whole check on the connected Ray cluster (``nodes``: its alive nodes);
    ``extra_findings`` (node id -> findings, e.g. a failed staging) join the reports.
    ``measure`` and ``gather``: what measures the collectives and probes the nodes, where
    not Ray (the scale harness's simulated fleet, runmgr/scale/fleet.py)."""
    started = clock()
    nodes = list(nodes) if nodes is not None else alive_nodes()
    if not nodes:
        raise ClusterError("the Ray cluster has no alive node to check: start the nodes first")
    progress(f"health-check: probing {len(nodes)} node(s) at once (devices, storage, data, "
             f"software, compute; at most {config.node_timeout_s:g} s each)")
    reports = (gather or gather_node_reports)(nodes, config, progress)
    for report in reports:
        report.findings.extend((extra_findings or {}).get(report.node, []))
    verdicts = decide(reports, config.fleet)
    outcome, notes = run_collectives(reports, verdicts, config, device_kind, progress, measure)
    if outcome is not None:
        verdicts = decide(reports, config.fleet)
    return FleetCheck(new_check_id(started), started, clock() - started, list(nodes), reports,
                      verdicts, outcome, coverage_notes(config, reports) + notes,
                      fleet_baseline(reports, config.fleet))


def coverage_notes(config: HealthConfig, reports: Sequence[NodeReport]) -> list[str]:
    """What the check looked at, and what it could not because nothing was configured."""
    kinds = Counter(str(r.facts.get("accelerator", "unknown")) for r in reports)
    notes = ["devices: " + ", ".join(f"{count} {kind} node(s)" for kind, count in sorted(kinds.items()))]
    if config.storage.mounts:
        notes.append("storage: " + ", ".join(m.path for m in config.storage.mounts))
    else:
        notes.append("storage: no shared mount configured (set health.storage.mounts)")
    if not config.data.local_path:
        notes.append("data: no local dataset configured (health.data.local_path)")
    notes += shared_host_notes(reports)
    return notes


def shared_host_notes(reports: Sequence[NodeReport]) -> list[str]:
    """One line (of 100 columns at most) when nodes share a machine: their speed figures are
    compared between machines (health.fleet.host_outliers), never among the nodes of one."""
    shared = shared_hosts(reports)
    if not shared:
        return []
    count = sum(len(nodes) for nodes in shared.values())
    return [f"hosts: {count} of {len(reports)} nodes share {len(shared)} machine(s): speed compared between "
            "machines, not within one"]
