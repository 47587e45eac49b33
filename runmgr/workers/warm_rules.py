"""The warm group's rules (runmgr/workers/warm_agents.py, on node agents): how long the survivors
are waited for and given to settle, the donor of a lost rank's snapshot, and the words of a late
survivor and of a slot not refilled. (Written once for both warm groups while the per-rank one,
runmgr/workers/warm_group.py, lived; it was retired when spares got devices under agents.)"""

from __future__ import annotations

from collections.abc import Iterable

from runmgr.controller.group import WarmRecoveryError

SURVIVOR_WAIT_S = 10.0
"""How long a recovery waits for the survivors to be waiting in their warm link (a
survivor's collective fails within ~0.05 s of a peer's death on gloo)."""
WARM_SETTLE_S = 0.1
"""Survivors do not echo a warm group's deaths (they wait in their warm link): no wait for a
root cause to surface."""


def donor_of(rank: int, holders: Iterable[int], lost: set[int]) -> int:
    """The first of ``holders`` (the ranks whose memory holds ``rank``'s snapshot) that survived."""
    for holder in holders:
        if holder not in lost:
            return holder
    raise WarmRecoveryError(f"no surviving rank holds rank {rank}'s memory snapshot")


def survivors_not_waiting(pending: Iterable[int], waited_s: float) -> WarmRecoveryError:
    """The error of a recovery whose ``pending`` survivors did not wait in their warm link within
    ``waited_s``."""
    return WarmRecoveryError(f"rank(s) {sorted(pending)} did not notice the lost peer within {waited_s:.0f} s")


def slot_not_refilled(rank: int, node: str) -> str:
    """Why the slot ``rank`` left on ``node`` gets no new spare: the plan avoids that node."""
    return (f"the spare rank {rank} took is not replaced: the slot rank {rank} left is on node {node}, which the "
            f"plan avoids; a further fault restarts cold unless a spare is ready")
