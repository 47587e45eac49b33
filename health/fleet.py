"""Fleet analysis: node reports in, verdicts out (admit / warn / exclude with
reasons). Pure: no I/O, no Ray, no clock.

A node is slow when it is an outlier against its peers, not against a fixed
number: beyond ``mad_k`` robust standard deviations (1.4826 x the median
absolute deviation) from the fleet median AND at least a relative floor worse
than the median, so that ordinary noise in a tight fleet excludes nobody.

Nodes that share one machine (several Ray nodes on a host, pods on one
Kubernetes node) compete for its cores, memory and disks: their figures are
not independent, and a busy neighbour makes one of them look slow. The fleet
is then compared host by host (a host's figure is the median of its nodes),
so a host with one slow node of its own is still excluded, and nodes are
never excluded for speed against the nodes they share a host with (at most
warned). A node's host is its ``node.host_id`` fact (see HOST_FACT); a node
without one counts as a host of its own.

A node excluded from a fleet can be re-checked alone (``decide_alone``)
against a ``fleet_baseline`` kept at exclusion time: the same rule, with the
fleet's median and spread as they were.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Literal, Mapping, Optional, Sequence

from health.config import FleetChecks
from health.findings import EvidenceValue, Severity
from health.node import NodeReport

VerdictKind = Literal["admit", "warn", "exclude"]
_MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution is 0.6745 sigma
HOST_FACT = "node.host_id"
"""Fact naming the machine a node runs on (the kernel's boot id, the same for every
container and raylet of one machine); nodes with the same value share a host."""
PEER_FIGURES = ("collectives.busbw_gbps",)
"""Figures only measured between nodes: a node checked alone cannot measure them."""
NOT_INDEPENDENT = ("not judged for exclusion: nodes on one host share its cores and memory, "
                   "their figures are not independent")


@dataclass(frozen=True)
class Outlier:
    """A node whose figure is worse than its peers'."""

    node: str
    figure: str
    value: float
    median: float
    severity: Severity
    """``fail`` beyond the exclusion floor, ``warn`` beyond the warning floor."""
    reason: str
    relative: float = 0.0
    """How much worse than the median, as a fraction of it."""


@dataclass(frozen=True)
class Verdict:
    """What the fleet analysis decided for one node."""

    node: str
    verdict: VerdictKind
    reasons: tuple[str, ...]
    """Why the node is excluded (empty unless excluded)."""
    warnings: tuple[str, ...]
    """What a person should look at, whatever the verdict."""

    def to_dict(self) -> dict:
        return {"node": self.node, "verdict": self.verdict, "reasons": list(self.reasons),
                "warnings": list(self.warnings)}


def figure_name(key: str) -> str:
    """``storage.write_mbps@/mnt/lustre`` -> ``storage.write_mbps``."""
    return key.split("@", 1)[0]


def spread(values: Sequence[float]) -> tuple[float, float]:
    """(median, robust sigma: 1.4826 x the median absolute deviation)."""
    median = statistics.median(values)
    return median, _MAD_TO_SIGMA * statistics.median(abs(v - median) for v in values)


def judge(value: float, median: float, sigma: float, higher_is_better: bool,
          checks: FleetChecks) -> Optional[tuple[Severity, float]]:
    """(severity, how much worse as a fraction of the median) when ``value`` is beyond
    ``mad_k`` sigmas AND at least ``warn_relative`` worse than ``median``; else None."""
    worse_by = (median - value) if higher_is_better else (value - median)
    if worse_by <= checks.mad_k * sigma:
        return None
    relative = worse_by / (abs(median) if median else 1.0)
    if relative >= checks.exclude_relative:
        return Severity.FAIL, relative
    if relative >= checks.warn_relative:
        return Severity.WARN, relative
    return None


def _side(higher_is_better: bool) -> str:
    return "below" if higher_is_better else "above"


def outliers(values: Mapping[str, float], figure: str, higher_is_better: bool,
             checks: FleetChecks) -> list[Outlier]:
    """Nodes whose ``figure`` is worse than the fleet's by robust statistics.

    Fewer than ``checks.min_nodes`` values: no judgement (too few peers).
    """
    if len(values) < checks.min_nodes:
        return []
    median, sigma = spread(list(values.values()))
    found = []
    for node, value in sorted(values.items()):
        judged = judge(value, median, sigma, higher_is_better, checks)
        if judged is None:
            continue
        severity, relative = judged
        found.append(Outlier(node, figure, value, median, severity,
                             f"{figure} {value:.4g} is {relative:.0%} {_side(higher_is_better)} the fleet "
                             f"median {median:.4g} ({len(values)} nodes)", relative))
    return found


def host_of(report: NodeReport) -> str:
    """The machine ``report``'s node runs on; a node that does not say counts as its own."""
    host = report.facts.get(HOST_FACT)
    return f"host:{host}" if host else f"node:{report.node}"


def by_host(nodes: Iterable[str], hosts: Mapping[str, str]) -> dict[str, list[str]]:
    """Host -> its nodes (in the order given); a node missing from ``hosts`` is a host alone."""
    groups: dict[str, list[str]] = {}
    for node in nodes:
        groups.setdefault(hosts.get(node, f"node:{node}"), []).append(node)
    return groups


def host_outliers(values: Mapping[str, float], hosts: Mapping[str, str], figure: str,
                  higher_is_better: bool, checks: FleetChecks) -> list[Outlier]:
    """:func:`outliers`, where nodes that share a host are not independent.

    Every node on a host of its own: exactly :func:`outliers`. Otherwise each host
    counts once, with the median of its nodes' values, and the hosts are judged
    against each other (``min_nodes`` hosts at least): every node of a slow host is
    excluded, and a slow node alone on its host still is. Within a host of
    ``min_nodes`` nodes or more, a node worse than its neighbours is only warned:
    it competes with them for the same cores, so the figures cannot tell a slow
    node from a busy host.
    """
    groups = by_host(sorted(values), hosts)
    if all(len(nodes) == 1 for nodes in groups.values()):
        return outliers(values, figure, higher_is_better, checks)
    side = _side(higher_is_better)
    host_values = {host: statistics.median(values[n] for n in nodes) for host, nodes in groups.items()}
    found = []
    for host in outliers(host_values, figure, higher_is_better, checks):
        nodes = groups[host.node]
        for node in nodes:
            measured = (f"{figure} {values[node]:.4g}" if len(nodes) == 1 else
                        f"{figure} {host.value:.4g} (the median of the {len(nodes)} nodes on its host)")
            found.append(Outlier(node, figure, values[node], host.median, host.severity,
                                 f"{measured} is {host.relative:.0%} {side} the fleet median "
                                 f"{host.median:.4g} ({len(groups)} hosts; nodes that share a host "
                                 "count as one)", host.relative))
    for nodes in groups.values():
        if len(nodes) < 2:
            continue
        for local in outliers({n: values[n] for n in nodes}, figure, higher_is_better, checks):
            found.append(Outlier(local.node, figure, local.value, local.median, Severity.WARN,
                                 f"{figure} {local.value:.4g} is {local.relative:.0%} {side} the median "
                                 f"{local.median:.4g} of the {len(nodes)} nodes on its host; "
                                 f"{NOT_INDEPENDENT}", local.relative))
    return found


def _directions(checks: FleetChecks) -> dict[str, bool]:
    return {**{n: True for n in checks.higher_is_better}, **{n: False for n in checks.lower_is_better}}


def figure_outliers(reports: Sequence[NodeReport], checks: FleetChecks) -> list[Outlier]:
    """Outliers for every compared figure present in the reports, host by host
    where nodes share one (:func:`host_outliers`)."""
    directions = _directions(checks)
    hosts = {r.node: host_of(r) for r in reports}
    keys = sorted({key for r in reports for key in r.figures if figure_name(key) in directions})
    found = []
    for key in keys:
        values = {r.node: r.figures[key] for r in reports if key in r.figures}
        found += host_outliers(values, hosts, key, directions[figure_name(key)], checks)
    return found


def shared_hosts(reports: Sequence[NodeReport]) -> dict[str, list[str]]:
    """Hosts holding more than one of the reports' nodes -> those nodes."""
    groups = by_host([r.node for r in reports], {r.node: host_of(r) for r in reports})
    return {host: nodes for host, nodes in groups.items() if len(nodes) > 1}


def _software_versions(report: NodeReport) -> Optional[dict[str, EvidenceValue]]:
    versions = {k[len("software."):]: v for k, v in report.facts.items()
                if k.startswith("software.")}
    return versions or None  # None: the software probe did not run on this node


def software_majority(reports: Sequence[NodeReport], keys: Sequence[str]) -> dict[str, Optional[str]]:
    """Key -> the version more than half of the nodes with a software report have
    (None: most lack the package); keys without such a majority are left out."""
    stacks = [v for r in reports if (v := _software_versions(r)) is not None]
    majority: dict[str, Optional[str]] = {}
    for key in keys:
        counts = Counter(stack.get(key) for stack in stacks)
        if counts:
            (top, top_count), = counts.most_common(1)
            if top_count * 2 > len(stacks):
                majority[key] = None if top is None else str(top)
    return majority


def software_outliers(reports: Sequence[NodeReport], keys: Sequence[str]
                      ) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """(nodes off the majority stack -> reasons, nodes with no majority -> notes)."""
    stacks = {r.node: v for r in reports if (v := _software_versions(r)) is not None}
    off: dict[str, list[str]] = {}
    undecided: dict[str, list[str]] = {}
    for key in keys:
        values = {node: stack.get(key) for node, stack in stacks.items()}
        counts = Counter(values.values())
        if len(counts) < 2:
            continue
        (top, top_count), = counts.most_common(1)
        if top_count * 2 <= len(values):
            spread = ", ".join(f"{v or 'absent'} x{c}" for v, c in counts.most_common())
            for node in values:
                undecided.setdefault(node, []).append(
                    f"no majority {key} version across the fleet ({spread}): align the stack")
            continue
        for node, value in values.items():
            if value != top:
                off.setdefault(node, []).append(
                    f"{key} {value or 'absent'} differs from the fleet's {top or 'absent'} "
                    f"({top_count} of {len(values)} nodes): align the stack")
    return off, undecided


def decide(reports: Sequence[NodeReport], checks: FleetChecks) -> list[Verdict]:
    """Verdicts for every node, in the order of ``reports``."""
    reasons: dict[str, list[str]] = {r.node: [] for r in reports}
    warnings: dict[str, list[str]] = {r.node: [] for r in reports}
    for report in reports:
        for finding in report.findings:
            if finding.severity is Severity.FAIL:
                reasons[report.node].append(finding.message)
            elif finding.severity is Severity.WARN:
                warnings[report.node].append(finding.message)
    for outlier in figure_outliers(reports, checks):
        bucket = reasons if outlier.severity is Severity.FAIL else warnings
        bucket[outlier.node].append(outlier.reason)
    off, undecided = software_outliers(reports, checks.software_keys)
    bucket = reasons if checks.software_mismatch == "exclude" else warnings
    for node, notes in off.items():
        bucket[node].extend(notes)
    for node, notes in undecided.items():
        warnings[node].extend(notes)
    verdicts = []
    for report in reports:
        node = report.node
        kind: VerdictKind = "exclude" if reasons[node] else ("warn" if warnings[node] else "admit")
        verdicts.append(Verdict(node, kind, tuple(reasons[node]), tuple(warnings[node])))
    return verdicts


def fleet_baseline(reports: Sequence[NodeReport], checks: FleetChecks) -> dict[str, Any]:
    """What a node excluded from this fleet is compared with when it is checked alone
    later (:func:`decide_alone`), as plain JSON-able data: for every compared figure
    the fleet judged (``min_nodes`` hosts or more), the median and robust sigma it
    judged against (over host medians where nodes share a host, as
    :func:`host_outliers` does), and the majority software stack."""
    directions = _directions(checks)
    hosts = {r.node: host_of(r) for r in reports}
    keys = sorted({key for r in reports for key in r.figures if figure_name(key) in directions})
    figures = {}
    for key in keys:
        values = {r.node: r.figures[key] for r in reports if key in r.figures}
        groups = by_host(sorted(values), hosts)
        if len(groups) < checks.min_nodes:
            continue  # the fleet could not judge this figure either
        median, sigma = spread([statistics.median(values[n] for n in nodes) for nodes in groups.values()])
        figures[key] = {"median": median, "sigma": sigma, "hosts": len(groups)}
    return {"figures": figures, "software": software_majority(reports, checks.software_keys),
            "nodes": len(reports), "hosts": len(by_host([r.node for r in reports], hosts))}


def peer_only_reasons(report: NodeReport, reasons: Sequence[str]) -> list[str]:
    """The reasons among ``reasons`` that only a test with other nodes can judge (the
    collectives: a node checked alone cannot re-measure them)."""
    found = [f.message for f in report.findings
             if f.severity is Severity.FAIL and f.code.startswith("collectives.")]
    found += [r for r in reasons if figure_name(r.split(" ", 1)[0]) in PEER_FIGURES]
    return [r for r in reasons if r in found]


def decide_alone(report: NodeReport, baseline: Optional[Mapping[str, Any]],
                 checks: FleetChecks) -> Verdict:
    """The verdict of a node checked alone (no peers), against ``baseline`` (a
    :func:`fleet_baseline`, with ``check`` and ``needs_peers`` of the exclusion
    added; None: none was kept). The node's own findings decide as in :func:`decide`;
    each figure of the baseline is judged with the same rule against the fleet
    median and spread recorded then; the software stack against the majority then.
    A node excluded for what only peers can measure (``needs_peers``) stays out."""
    reasons = [f.message for f in report.findings if f.severity is Severity.FAIL]
    warnings = [f.message for f in report.findings if f.severity is Severity.WARN]
    directions = _directions(checks)
    if baseline is None:
        warnings.append("no fleet baseline was kept for this node: its speed was not compared")
        baseline = {}
    when = f" when it was excluded ({baseline['check']})" if baseline.get("check") else " when it was excluded"
    for key, ref in sorted((baseline.get("figures") or {}).items()):
        higher = directions.get(figure_name(key))
        if higher is None or key not in report.figures:
            continue
        value, median = report.figures[key], float(ref["median"])
        judged = judge(value, median, float(ref.get("sigma", 0.0)), higher, checks)
        if judged is None:
            continue
        severity, relative = judged
        (reasons if severity is Severity.FAIL else warnings).append(
            f"{key} {value:.4g} is {relative:.0%} {_side(higher)} the fleet median {median:.4g} kept"
            f"{when} ({ref.get('hosts', '?')} hosts)")
    stack = _software_versions(report) or {}
    mismatch = reasons if checks.software_mismatch == "exclude" else warnings
    for key, expected in sorted((baseline.get("software") or {}).items()):
        if key in checks.software_keys and stack and stack.get(key) != expected:
            mismatch.append(f"{key} {stack.get(key) or 'absent'} differs from the fleet's "
                            f"{expected or 'absent'}{when}: align the stack")
    needs_peers = list(baseline.get("needs_peers") or [])
    if needs_peers:
        reasons.append(f"excluded{when} for what a check of this node alone cannot measure "
                       f"({needs_peers[0]}): readmit it by hand once repaired (`runmgr health-check "
                       "--readmit NODE`) and the next full check judges it with its peers")
    kind: VerdictKind = "exclude" if reasons else ("warn" if warnings else "admit")
    return Verdict(report.node, kind, tuple(reasons), tuple(warnings))
