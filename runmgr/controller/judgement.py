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
        return self.decision.restarts or self.decision.action == ABORT
