"""What each incident class cost the run, and the mean time between incidents.

A sub-run is *ended by an incident* when its last decision other than
``ignore`` answered an incident (the controller records incident, decision,
then the sub-run's end). The cost of the restart that followed (the next
sub-run's lost steps, redone seconds, downtime and restart seconds; see
logbook.accounting) goes to that incident's kind; a restart that followed a
sub-run no incident ended (a person stopped it, its driver died) goes to
:data:`NO_INCIDENT`.

MTBI (mean time between incidents) = wall time (the ETTR denominator) /
number of sub-runs ended by an incident; None when none was.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from logbook.accounting import SubRunCost
from logbook.records import SubRun

NO_INCIDENT = "no_incident"
"""The class of restarts after a sub-run that no incident ended."""
IGNORED = "ignore"
"""The decision action that lets a sub-run go on."""


@dataclass(frozen=True)
class ClassCost:
    """What one incident class cost the run."""

    kind: str
    """Incident kind (loss_spike, worker_death, hang, ...), or :data:`NO_INCIDENT`."""
    incidents: int
    """Incidents of that kind (ignored ones included)."""
    restarts: int
    """Sub-runs they ended."""
    steps_lost: int
    """Steps trained past the restart point and thrown away."""
    redone_s: float
    """Seconds of training spent on those steps (their step_time)."""
    downtime_s: float
    """Seconds from a sub-run's end to the next one's start."""
    restart_s: float
    """Seconds from the next sub-run's start to its first step."""

    @property
    def wall_lost_s(self) -> float:
        """Redone + downtime + restart."""
        return self.redone_s + self.downtime_s + self.restart_s

    def to_dict(self) -> dict:
        """JSON-able, with ``wall_lost_s``."""
        return {"kind": self.kind, "incidents": self.incidents, "restarts": self.restarts,
                "steps_lost": self.steps_lost, "redone_s": self.redone_s, "downtime_s": self.downtime_s,
                "restart_s": self.restart_s, "wall_lost_s": self.wall_lost_s}


def ending_incidents(subruns: Sequence[SubRun], events: Sequence[dict]) -> dict[str, dict]:
    """Ended sub-run id -> the incident event that ended it (see the module docstring)."""
    incidents = {event["id"]: event for event in events if event["type"] == "incident"}
    answered: dict[str, Optional[dict]] = {}
    for event in events:
        if event["type"] == "decision" and event["action"] != IGNORED:
            answered[event["subrun"]] = incidents.get(event["incident_id"])
    ended = {subrun.id for subrun in subruns if not subrun.is_open}
    return {sid: incident for sid, incident in answered.items() if incident is not None and sid in ended}


def class_costs(subruns: Sequence[SubRun], costs: Mapping[str, SubRunCost],
                events: Sequence[dict]) -> list[ClassCost]:
    """One :class:`ClassCost` per incident kind seen (and :data:`NO_INCIDENT` when such
    restarts happened), the most wall time lost first."""
    ending = ending_incidents(subruns, events)
    totals: dict[str, list] = {}

    def tally(kind: str) -> list:
        return totals.setdefault(kind, [0, 0, 0, 0.0, 0.0, 0.0])

    for event in events:
        if event["type"] == "incident":
            tally(event["kind"])[0] += 1
    for sid, incident in ending.items():
        tally(incident["kind"])[1] += 1
    for previous, subrun in zip(subruns, subruns[1:]):
        incident = ending.get(previous.id)
        entry = tally(NO_INCIDENT if incident is None else incident["kind"])
        if incident is None:
            entry[1] += 1
        cost = costs.get(subrun.id, SubRunCost(0, 0.0, 0.0))
        entry[2] += cost.lost_steps
        entry[3] += cost.lost_step_time
        entry[4] += cost.downtime
        entry[5] += cost.restart
    found = [ClassCost(kind, *values) for kind, values in totals.items()]
    return sorted(found, key=lambda c: (-c.wall_lost_s, -c.restarts, c.kind))


def mtbi(subruns: Sequence[SubRun], events: Sequence[dict], wall_time_s: float) -> Optional[float]:
    """Mean time between incidents that ended a sub-run (module docstring)."""
    count = len(ending_incidents(subruns, events))
    return wall_time_s / count if count and wall_time_s > 0 else None
