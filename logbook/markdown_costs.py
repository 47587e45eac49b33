"""The cost of each incident class, counted from the lineage, for the
Markdown export while logbook.report (the run report every view reads) is
not installed; with it, the export reads ``run_report(book).costs``.

The sub-run an incident ended is charged to that incident's kind: the lost
steps and redone training of the next start, the down time between the two,
and the restart (from the next start to its workers being up)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Mapping, Optional

from logbook.records import SubRun
from logbook.store import Logbook


@dataclass(frozen=True)
class LineageClassCost:
    """What one incident class cost the run (the fields of logbook.report.ClassCost)."""

    kind: str
    incidents: int
    restarts: int
    steps_lost: int
    redone_s: float
    downtime_s: float
    restart_s: float

    @property
    def wall_lost_s(self) -> float:
        """Redone training, down time and restart together."""
        return self.redone_s + self.downtime_s + self.restart_s


def class_costs_from_lineage(book: Logbook) -> list[LineageClassCost]:
    """One row per incident kind seen, most wall time lost first."""
    lineage, events, costs = book.lineage(), book.events(), book.costs()
    counted = Counter(e["kind"] for e in events if e["type"] == "incident")
    totals: dict[str, list[float]] = {kind: [0, 0, 0.0, 0.0, 0.0] for kind in counted}
    for previous, subrun in zip(lineage, lineage[1:]):
        kind = _ending_kind(subrun, [e for e in events if e["subrun"] == previous.id])
        if kind is None:
            continue
        cost = costs[subrun.id]
        up = next((e["time"] for e in events if e["subrun"] == subrun.id and e.get("kind") == "workers_started"), None)
        row = totals.setdefault(kind, [0, 0, 0.0, 0.0, 0.0])
        row[0] += 1
        row[1] += cost.lost_steps
        row[2] += cost.lost_step_time
        row[3] += cost.downtime
        row[4] += max(0.0, up - subrun.started_at) if up is not None else 0.0
    rows = [LineageClassCost(kind, counted.get(kind, 0), int(r[0]), int(r[1]), r[2], r[3], r[4])
            for kind, r in totals.items()]
    return sorted(rows, key=lambda c: (-c.wall_lost_s, c.kind))


def _ending_kind(subrun: SubRun, previous_events: list[dict]) -> Optional[str]:
    """The kind of the incident that ended the previous sub-run: the one this start
    names, else the last one recorded before the end; None for a stop or relaunch."""
    evidence = subrun.evidence if isinstance(subrun.evidence, Mapping) else {}
    incident = evidence.get("incident")
    if isinstance(incident, Mapping) and isinstance(incident.get("kind"), str):
        return incident["kind"]
    kinds = [e["kind"] for e in previous_events if e["type"] == "incident"]
    return kinds[-1] if kinds else None
