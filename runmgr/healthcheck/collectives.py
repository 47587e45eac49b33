"""Collective tests across nodes: one small Ray actor per node joins a
torch.distributed group with its peers (the run's backend: gloo on CPU, NCCL,
HCCL), measures all-reduce bus bandwidth, and leaves.

Seed 000's method: pairs first; every member of a slow (or failed) pair is
paired again with a healthy node, so that a slow node is told apart from a
slow link (see :mod:`health.groups` for the judgement, which is pure).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Callable, Mapping, Optional, Sequence

from health.config import CollectiveChecks, FleetChecks
from health.findings import ProbeResult, fail, ok, warn
from health.groups import Blame, Group, blame, plan_groups, regroup, slow_groups
from runmgr.ports import rendezvous_port

Measure = Callable[[list[Group]], tuple[dict[Group, float], dict[Group, str]]]
"""Measure disjoint groups at once: (bandwidth per group, failure text per group)."""
FIGURE = "collectives.busbw_gbps"


class CollectiveMember:
    """One node's end of the group tests (a Ray actor pinned to the node)."""

    def __init__(self, device_kind: str) -> None:
        self.device_kind = device_kind

    def rendezvous(self) -> str:
        """``tcp://ip:port`` on this node for a group this member leads."""
        import ray

        return f"tcp://{ray.util.get_node_ip_address()}:{rendezvous_port()}"

    def measure(self, init_method: str, rank: int, world_size: int,
                checks: CollectiveChecks) -> float:
        """Join the group, measure, leave; every member gets the same figure."""
        import torch.distributed as dist

        from health.probes.collectives import allreduce_busbw_gbps
        from trainer.device import resolve_device

        device = resolve_device(self.device_kind, local_rank=0, deterministic=False)
        dist.init_process_group(device.backend, init_method=init_method, rank=rank,
                                world_size=world_size, timeout=timedelta(seconds=checks.timeout_s))
        try:
            return allreduce_busbw_gbps(checks.megabytes, checks.iterations,
                                        device=str(device.torch_device))
        finally:
            dist.destroy_process_group()


@dataclass
class CollectiveOutcome:
    """Both rounds of group tests and who is to blame."""

    first: dict[Group, float] = field(default_factory=dict)
    """Round one: bandwidth of each planned group, GB/s."""
    second: dict[Group, float] = field(default_factory=dict)
    """Round two: each suspect paired with a healthy node (suspect first)."""
    failed: dict[Group, str] = field(default_factory=dict)
    """Groups that could not form or finish, with the error."""
    blame: Blame = field(default_factory=Blame)

    def node_bandwidth(self) -> dict[str, float]:
        """Each node's best bandwidth over the groups it was in: a slow link
        leaves its nodes fast elsewhere, a slow node is slow everywhere."""
        best: dict[str, float] = {}
        for group, value in [*self.first.items(), *self.second.items()]:
            if group in self.failed:
                continue
            for node in group:
                best[node] = max(best.get(node, 0.0), value)
        return best

    def to_dict(self) -> dict:
        name = "+".join
        return {"first": {name(g): v for g, v in self.first.items()},
                "second": {name(g): v for g, v in self.second.items()},
                "failed": {name(g): text for g, text in self.failed.items()},
                "slow_nodes": dict(self.blame.slow_nodes),
                "slow_links": {name(g): text for g, text in self.blame.slow_links.items()}}


def collective_rounds(nodes: Sequence[str], measure: Measure, checks: CollectiveChecks,
                      fleet: FleetChecks) -> CollectiveOutcome:
    """Round one over planned groups, round two over the suspects' re-pairings."""
    outcome = CollectiveOutcome()
    outcome.first, outcome.failed = measure(plan_groups(nodes, checks.group_size))
    suspects = [g for g in outcome.first if g in outcome.failed]
    suspects += slow_groups(_measured(outcome.first, outcome.failed), fleet)
    healthy = [n for g in outcome.first if g not in suspects for n in g]
    for wave in regroup(suspects, healthy):
        measured, failed = measure(wave)
        outcome.second.update(measured)
        outcome.failed.update(failed)
    # Failed groups are judged by _failure_results; blame compares the measured ones.
    outcome.blame = blame(_measured(outcome.first, outcome.failed),
                          _measured(outcome.second, outcome.failed), fleet)
    return outcome


def _measured(bandwidth: Mapping[Group, float], failed: Mapping[Group, str]) -> dict[Group, float]:
    return {g: v for g, v in bandwidth.items() if g not in failed}


def _failure_results(outcome: CollectiveOutcome) -> dict[str, ProbeResult]:
    """A node whose re-pairing failed too is broken; a failed pair whose
    members both work with healthy partners points at the path between them."""
    results: dict[str, ProbeResult] = {}
    for group, text in outcome.failed.items():
        if group not in outcome.first:
            continue
        cleared = []
        for node in group:
            retests = {g: v for g, v in outcome.second.items() if g[0] == node}
            if not retests:  # no healthy node to pair it with: cannot tell who is at fault
                results.setdefault(node, ProbeResult()).findings.append(warn(
                    "collectives.unattributed",
                    f"all-reduce failed in {'+'.join(group)} ({text}) and no healthy node was "
                    "left to tell which member is at fault", group="+".join(group)))
                continue
            if all(g in outcome.failed for g in retests):
                partner = next(iter(retests))[1]
                results.setdefault(node, ProbeResult()).findings.append(fail(
                    "collectives.failed",
                    f"all-reduce failed with {'+'.join(group)} and again with healthy "
                    f"{partner}: {outcome.failed[next(iter(retests))]}", group="+".join(group)))
            else:
                cleared.append(node)
        if cleared and len(cleared) == len(group):
            for node in group:
                results.setdefault(node, ProbeResult()).findings.append(warn(
                    "collectives.link_failed",
                    f"{' and '.join(group)} could not all-reduce together ({text}) but work "
                    "with other nodes: check the path between them", group="+".join(group)))
    return results


def collective_results(outcome: CollectiveOutcome) -> dict[str, ProbeResult]:
    """Per node: the bandwidth figure and the blame findings, to fold into its report."""
    results = _failure_results(outcome)
    for node, value in outcome.node_bandwidth().items():
        result = results.setdefault(node, ProbeResult())
        result.figures[FIGURE] = value
        result.findings.append(ok("collectives.measured",
                                  f"all-reduce bus bandwidth up to {value:.3g} GB/s"))
    for node, reason in outcome.blame.slow_nodes.items():
        results.setdefault(node, ProbeResult()).findings.append(
            fail("collectives.slow_node", reason))
    for group, reason in outcome.blame.slow_links.items():
        for node in group:
            results.setdefault(node, ProbeResult()).findings.append(
                warn("collectives.slow_link", reason, group="+".join(group)))
    return results


class RayMeasure:
    """Measures groups with one :class:`CollectiveMember` actor per node."""

    def __init__(self, node_ids: Sequence[str], device_kind: str, checks: CollectiveChecks) -> None:
        self.device_kind = device_kind
        self.checks = checks
        self.members: dict[str, object] = {n: self._member(n) for n in node_ids}

    def _member(self, node_id: str):
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from runmgr.placement import actor_resources

        resources = actor_resources(self.device_kind, 0, 1)
        remote = ray.remote(max_restarts=0)(CollectiveMember)
        return remote.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
                              **resources).remote(self.device_kind)

    def __call__(self, groups: list[Group]) -> tuple[dict[Group, float], dict[Group, str]]:
        import ray
        from ray.exceptions import GetTimeoutError, RayError

        pending = {}
        measured: dict[Group, float] = {}
        failed: dict[Group, str] = {}
        for group in groups:
            try:
                init = ray.get(self.members[group[0]].rendezvous.remote(), timeout=self.checks.timeout_s)
            except (GetTimeoutError, RayError) as exc:
                measured[group], failed[group] = 0.0, _first_line(exc)
                continue
            pending[group] = [self.members[n].measure.remote(init, rank, len(group), self.checks)
                              for rank, n in enumerate(group)]
        for group, refs in pending.items():
            try:
                measured[group] = min(ray.get(refs, timeout=self.checks.timeout_s + 5.0))
            except (GetTimeoutError, RayError) as exc:
                measured[group], failed[group] = 0.0, _first_line(exc)
                self._replace(group)  # a member may be stuck in the group: start afresh
        return measured, failed

    def _replace(self, group: Group) -> None:
        import ray

        for node in group:
            ray.kill(self.members[node], no_restart=True)
            self.members[node] = self._member(node)

    def close(self) -> None:
        import ray

        for member in self.members.values():
            ray.kill(member, no_restart=True)
        self.members = {}


def _first_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return (lines[-1] if lines else type(exc).__name__)[:300]


def measure_collectives(node_ids: Sequence[str], device_kind: str, checks: CollectiveChecks,
                        fleet: FleetChecks, measure: Optional[Measure] = None) -> CollectiveOutcome:
    """Both rounds over ``node_ids`` with Ray actors (or an injected ``measure``)."""
    if measure is not None:
        return collective_rounds(node_ids, measure, checks, fleet)
    ray_measure = RayMeasure(node_ids, device_kind, checks)
    try:
        return collective_rounds(node_ids, ray_measure, checks, fleet)
    finally:
        ray_measure.close()
