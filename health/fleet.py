"""Fleet analysis: node reports in, verdicts out (admit / warn / exclude with
reasons). Pure: no I/O, no Ray, no clock.

A node is slow when it is an outlier against its peers, not against a fixed
number: beyond ``mad_k`` robust standard deviations (1.4826 x the median
absolute deviation) from the fleet median AND at least a relative floor worse
than the median, so that ordinary noise in a tight fleet excludes nobody.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass
from typing import Literal, Mapping, Optional, Sequence

from health.config import FleetChecks
from health.findings import EvidenceValue, Severity
from health.node import NodeReport

VerdictKind = Literal["admit", "warn", "exclude"]
_MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution is 0.6745 sigma


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


def outliers(values: Mapping[str, float], figure: str, higher_is_better: bool,
             checks: FleetChecks) -> list[Outlier]:
    """Nodes whose ``figure`` is worse than the fleet's by robust statistics.

    Fewer than ``checks.min_nodes`` values: no judgement (too few peers).
    """
    if len(values) < checks.min_nodes:
        return []
    median = statistics.median(values.values())
    sigma = _MAD_TO_SIGMA * statistics.median(abs(v - median) for v in values.values())
    scale = abs(median) if median else 1.0
    found = []
    for node, value in sorted(values.items()):
        worse_by = (median - value) if higher_is_better else (value - median)
        if worse_by <= checks.mad_k * sigma:
            continue
        relative = worse_by / scale
        if relative >= checks.exclude_relative:
            severity = Severity.FAIL
        elif relative >= checks.warn_relative:
            severity = Severity.WARN
        else:
            continue
        side = "below" if higher_is_better else "above"
        found.append(Outlier(node, figure, value, median, severity,
                             f"{figure} {value:.4g} is {relative:.0%} {side} the fleet median "
                             f"{median:.4g} ({len(values)} nodes)"))
    return found


def figure_outliers(reports: Sequence[NodeReport], checks: FleetChecks) -> list[Outlier]:
    """Outliers for every compared figure present in the reports."""
    directions = {**{n: True for n in checks.higher_is_better},
                  **{n: False for n in checks.lower_is_better}}
    keys = sorted({key for r in reports for key in r.figures if figure_name(key) in directions})
    found = []
    for key in keys:
        values = {r.node: r.figures[key] for r in reports if key in r.figures}
        found += outliers(values, key, directions[figure_name(key)], checks)
    return found


def _software_versions(report: NodeReport) -> Optional[dict[str, EvidenceValue]]:
    versions = {k[len("software."):]: v for k, v in report.facts.items()
                if k.startswith("software.")}
    return versions or None  # None: the software probe did not run on this node


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
