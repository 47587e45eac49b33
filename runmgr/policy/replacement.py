"""Replacing an excluded node: where the cluster brings up a new node in place of
one a decision takes out (KubeRay starts a new worker pod for the one it deletes,
the node's label keeping it off the bad machine), the restart is sized on the
nodes there will be, not on those left, and waits for the new one when the
nodes left (the spare pods) cannot hold the full size meanwhile."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from runmgr.policy.capacity import Capacity, fit_world


@dataclass(frozen=True)
class Replacement:
    """What a restart that excludes nodes asks of the cluster, and what it is sized on."""

    capacity: Capacity
    """The capacity to size the restart on (with the replacements when they are awaited)."""
    replace_nodes: tuple[str, ...] = ()
    """Excluded nodes to replace (empty: the cluster replaces none)."""
    await_ranks: int = 0
    """Ranks the usable nodes must hold before the restart (0: no wait)."""
    await_timeout_s: float = 0.0
    note: str = ""
    """What the reason says of it (empty when nothing is replaced)."""

    def decision_fields(self) -> dict:
        """The :class:`~runmgr.policy.decision.Decision` fields that carry it out."""
        return {"replace_nodes": self.replace_nodes, "await_ranks": self.await_ranks,
                "await_timeout_s": self.await_timeout_s}


def plan_replacement(capacity: Capacity, avoid: Collection[str], exclude: tuple[str, ...]) -> Replacement:
    """The replacement of ``exclude`` (taken out now; ``avoid``: every node out, these included)."""
    if capacity.replacement_wait_s is None or not exclude:
        return Replacement(capacity)
    now = fit_world(capacity, avoid)
    restored = capacity.with_replacements(exclude)
    later = fit_world(restored, avoid)
    pods = ", ".join(exclude)
    if later.size is None or (now.size is not None and now.size >= later.size):
        return Replacement(capacity, exclude,
                           note=f"; the cluster replaces the pod of {pods} (the nodes left hold the ranks meanwhile)")
    ranks = later.size * capacity.ranks_per_replica
    return Replacement(restored, exclude, ranks, capacity.replacement_wait_s,
                       note=(f"; the cluster replaces the pod of {pods}: the next sub-run waits up to "
                             f"{capacity.replacement_wait_s:g} s for {ranks} rank(s) of room, at data parallel "
                             f"{later.size}"))
