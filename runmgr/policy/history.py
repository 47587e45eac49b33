"""What the policy remembers: every incident with its decision, immutably.

The controller keeps one :class:`History` per lineage and replaces it with
``history.record(...)`` after each decision; the policy reads it to spend
budgets, climb the ladder and break restart storms. It can be rebuilt from
the logbook, so a relaunched driver decides as the old one would have.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

from runmgr.policy.checkpoints import VerifiedCheckpoint, newest
from runmgr.policy.decision import (
    ABORT, DUMP_AND_RESTART, EXCLUDE_NODE, INSTABILITY_ACTIONS, RESTART, RETRY_LAUNCH, Decision,
)
from runmgr.watch.incidents import Incident

FAULT_RESTARTS = frozenset({RESTART, DUMP_AND_RESTART, EXCLUDE_NODE})
"""Actions that spend the restart budget (the ladder's rungs have budgets of their own)."""


@dataclass(frozen=True)
class Entry:
    """One decided incident."""

    incident: Incident
    decision: Decision
    newest_checkpoint_step: Optional[int]
    """The newest verified checkpoint when the decision was taken (restart-storm test)."""


@dataclass(frozen=True)
class History:
    """The lineage's decided incidents, oldest first."""

    entries: tuple[Entry, ...] = ()

    def record(self, incident: Incident, decision: Decision,
               checkpoints: Sequence[VerifiedCheckpoint] = ()) -> "History":
        """A new history with this decision appended (the old one is unchanged)."""
        latest = newest(checkpoints)
        return History(self.entries + (Entry(incident, decision, latest.step if latest else None),))

    def uses(self, action: str) -> int:
        """Times ``action`` was decided."""
        return sum(1 for e in self.entries if e.decision.action == action)

    def fault_restarts(self) -> int:
        """Restarts spent on worker deaths, hangs and exclusions."""
        return sum(1 for e in self.entries if e.decision.action in FAULT_RESTARTS)

    def lr_scale(self) -> float:
        """Product of every LR cut so far (kept for the rest of the run)."""
        scale = 1.0
        for entry in self.entries:
            scale *= entry.decision.lr_factor
        return scale

    def clip_grad(self) -> Optional[float]:
        """The clipping threshold the policy last set, if any."""
        clips = [e.decision.clip_grad for e in self.entries if e.decision.clip_grad is not None]
        return clips[-1] if clips else None

    def excluded_nodes(self) -> tuple[str, ...]:
        """Nodes excluded so far, in order."""
        seen: dict[str, None] = {}
        for entry in self.entries:
            seen.update(dict.fromkeys(entry.decision.exclude_nodes))
        return tuple(seen)

    def closing_entry(self, subrun: str) -> Optional[Entry]:
        """The decision that already ended ``subrun`` (restart or abort), if any."""
        if not subrun:
            return None
        for entry in self.entries:
            if entry.incident.subrun == subrun and (entry.decision.restarts or entry.decision.action == ABORT):
                return entry
        return None

    def instability_streak(self, onset_step: int, window_steps: int) -> list[Entry]:
        """The previous ladder decisions chained to ``onset_step``: each onset within
        ``window_steps`` of the next one. Newest first."""
        chain: list[Entry] = []
        reference = onset_step
        for entry in reversed(self.entries):
            if entry.decision.action not in INSTABILITY_ACTIONS:
                continue
            onset = entry.incident.onset_step
            if onset is None or abs(reference - onset) > window_steps:
                break
            chain.append(entry)
            reference = onset
        return chain

    def stuck_restarts(self, newest_checkpoint_step: Optional[int]) -> list[Entry]:
        """The latest restarting decisions, newest first, taken while the newest verified
        checkpoint was already ``newest_checkpoint_step``: restarts that never got past it.
        Launch retries have their own budget and do not count."""
        stuck: list[Entry] = []
        for entry in reversed(self.entries):
            if not entry.decision.restarts or entry.decision.action == RETRY_LAUNCH:
                continue
            if entry.newest_checkpoint_step != newest_checkpoint_step:
                break
            stuck.append(entry)
        return stuck

    def strikes(self, kind: str, node: str, now: float, window_s: float) -> int:
        """Incidents of ``kind`` naming ``node`` within ``window_s`` before ``now``."""
        return sum(1 for e in self.entries
                   if e.incident.kind == kind and node in e.incident.nodes and now - e.incident.time <= window_s)
