"""Checks every restarting decision passes: the restart-storm breaker.

"N restarts that never get past the same checkpoint" means a restart cannot
help (a bad node that is not identified, a corrupt checkpoint, a
deterministic failure): the run stops and a human looks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

from runmgr.policy.checkpoints import VerifiedCheckpoint, newest
from runmgr.config.policy import PolicyConfig
from runmgr.policy.decision import ABORT, Decision
from runmgr.policy.history import History
from runmgr.watch.incidents import Incident


def storm_abort(incident: Incident, history: History, config: PolicyConfig,
                checkpoints: Sequence[VerifiedCheckpoint]) -> Optional[Decision]:
    """An abort when the last ``storm_restarts`` restarts never produced a newer checkpoint."""
    latest = newest(checkpoints)
    latest_step = latest.step if latest else None
    stuck = history.stuck_restarts(latest_step)
    limit = config.restarts.storm_restarts
    if len(stuck) < limit:
        return None
    where = f"checkpoint step {latest_step}" if latest_step is not None else "initialisation"
    causes = "; ".join(f"{e.incident.kind} ({_cause(e.incident)}) -> {e.decision.action}"
                       for e in reversed(stuck[:limit]))
    return Decision(ABORT, (
        f"restart storm: the last {len(stuck)} restarts all began with the newest verified checkpoint at "
        f"{where} and none produced a newer one (limit {limit}): {causes}; now {incident.kind} again. "
        f"A human must look at why the run cannot get past {where}: the nodes it lands on, the checkpoint "
        f"itself, or a failure that repeats deterministically"))


def _cause(incident: Incident) -> str:
    cause = incident.evidence.get("cause")
    if cause:
        return str(cause)
    return f"onset step {incident.onset_step}" if incident.onset_step is not None else "no step"
