"""What the judge hands the controller and its observers: an incident and the
policy's decision on it."""

from __future__ import annotations

from dataclasses import dataclass

from runmgr.policy.decision import ABORT, Decision
from runmgr.watch.incidents import Incident


@dataclass(frozen=True)
class Judgement:
    """An incident and the policy's decision on it."""

    incident: Incident
    decision: Decision

    @property
    def ends_subrun(self) -> bool:
        """The decision ends the sub-run now (a remedy held for a person's approval does not yet)."""
        return (self.decision.restarts or self.decision.action == ABORT) and not self.decision.awaits_approval

    @property
    def awaits_approval(self) -> bool:
        return self.decision.awaits_approval
