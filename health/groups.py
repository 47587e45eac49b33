"""Small-group collective tests: which nodes to group, and who is to blame.

Seed 000's method, made mechanical: measure all-reduce bandwidth in small
groups (pairs first), compare the groups with each other, then regroup each
member of a slow group with a node from a fast group. A node that is slow
with a healthy partner too is a slow node; two nodes that are each fine with
healthy partners but slow together point at the path between them (a link).
Pure functions: the caller runs the measurements (Ray, torch.distributed).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from health.config import FleetChecks
from health.fleet import outliers
from health.findings import Severity

Group = tuple[str, ...]


def plan_groups(nodes: Sequence[str], size: int = 2) -> list[Group]:
    """Consecutive groups of ``size``; a remainder joins the last group."""
    if size < 2:
        raise ValueError(f"group size must be >= 2, got {size}")
    ordered = list(nodes)
    groups = [tuple(ordered[i:i + size]) for i in range(0, len(ordered), size)]
    if len(groups) > 1 and len(groups[-1]) < size:
        remainder = groups.pop()
        groups[-1] = groups[-1] + remainder
    return [g for g in groups if len(g) > 1]


def slow_groups(bandwidth: Mapping[Group, float], checks: FleetChecks) -> list[Group]:
    """Groups whose bandwidth is an outlier below the others (robust statistics)."""
    by_name = {"+".join(g): g for g in bandwidth}
    values = {"+".join(g): bw for g, bw in bandwidth.items()}
    found = outliers(values, "collectives.busbw_gbps", True, checks)
    return [by_name[o.node] for o in found if o.severity is Severity.FAIL]


def regroup(suspects: Sequence[Group], healthy: Sequence[str]) -> list[list[Group]]:
    """Pair every member of a slow group with a healthy node.

    Returns waves of disjoint pairs: pairs in one wave can run at the same time;
    a healthy node is reused only in a later wave.
    """
    if not healthy:
        return []
    pending = [node for group in suspects for node in group]
    waves: list[list[Group]] = []
    while pending:
        wave_size = min(len(pending), len(healthy))
        waves.append([(pending[i], healthy[i]) for i in range(wave_size)])
        pending = pending[wave_size:]
    return waves


@dataclass
class Blame:
    """Who is to blame for slow groups."""

    slow_nodes: dict[str, str] = field(default_factory=dict)
    """Node -> reason: slow with a healthy partner too."""
    slow_links: dict[Group, str] = field(default_factory=dict)
    """Group -> reason: its members are fine apart, slow together."""


def blame(first: Mapping[Group, float], second: Mapping[Group, float],
          checks: FleetChecks) -> Blame:
    """Attribute the slow groups of ``first`` using the regrouped ``second`` round."""
    slow = slow_groups(first, checks)
    fast = [bw for g, bw in first.items() if g not in slow]
    if not slow or not fast:
        return Blame()
    reference = statistics.median(fast)
    limit = reference * (1.0 - checks.exclude_relative)
    result = Blame()
    for group in slow:
        cleared = []
        for node in group:
            tests = {pair: bw for pair, bw in second.items() if pair[0] == node}
            if not tests:
                continue
            if all(bw < limit for bw in tests.values()):
                pair, bw = min(tests.items(), key=lambda item: item[1])
                result.slow_nodes[node] = (
                    f"all-reduce with healthy {pair[1]} reaches {bw:.3g} GB/s, below "
                    f"{limit:.3g} (fleet {reference:.3g}): the node's network or PCIe is slow")
            else:
                cleared.append(node)
        if len(cleared) == len(group):
            result.slow_links[group] = (
                f"{' and '.join(group)} reach {first[group]:.3g} GB/s together but are fast "
                f"with other nodes (fleet {reference:.3g}): check the path between them")
    return result
