"""The report every view reads (``show``, ``list``, the Markdown export, the
web page, ``--json``): a run's lineage with what each sub-run and each
incident class cost, MTBI and ETTR over time. Definitions:
logbook.accounting (kept, lost, ETTR, restart) and logbook.incident_costs
(per class, MTBI)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from logbook.accounting import SubRunCost
from logbook.incident_costs import ClassCost, class_costs, mtbi
from logbook.records import SubRun
from logbook.store import Logbook

__all__ = ["ClassCost", "RunReport", "SubRunReport", "run_report"]

OPEN_STATE = "running"
"""A run whose last sub-run has no recorded end (still running, or its driver died)."""
EMPTY_STATE = "empty"
"""A logbook with no sub-run yet."""


@dataclass(frozen=True)
class SubRunReport:
    """One sub-run as the views show it."""

    id: str
    started_at: float
    ended_at: Optional[float]
    start_step: int
    last_step: Optional[int]
    """How far it got: its recorded end step or its metrics, whichever is further."""
    end_state: Optional[str]
    cause: str
    """Why it started (the incident summary, or ``launch``)."""
    start_checkpoint: Optional[str]
    """Relative to the run dir when inside it (``Logbook.resolve`` opens it)."""
    plan: dict
    config_diff: dict
    lost_steps: int
    """Steps the previous sub-run trained past this one's start."""
    downtime_s: float
    """Seconds from the previous sub-run's end to this start."""
    restart_s: float
    """Seconds from this start to its first step."""
    incident_ids: tuple[int, ...]
    """The incidents seen during it (event ids)."""
    redone_s: float = 0.0
    """Seconds of training spent on the steps this start threw away."""
    paused_s: float = 0.0
    """Seconds the run stood stopped by a person before this start (not downtime, not wall time)."""


@dataclass(frozen=True)
class RunReport:
    """A run: lineage, summary, costs by incident class, MTBI, ETTR over time."""

    run_dir: Path
    name: str
    state: str
    """The last sub-run's end state, ``running`` while it has none, ``empty`` with no sub-run."""
    subruns: tuple[SubRunReport, ...]
    summary: dict
    """``Logbook.summary()``."""
    costs: tuple[ClassCost, ...]
    """By class, most wall time lost first."""
    mtbi_s: Optional[float]
    """Mean time between incidents that ended a sub-run."""
    ettr_series: tuple[tuple[float, float], ...]
    """(unix time, ETTR up to then), one point per sub-run end."""
    last_incident: Optional[str]
    """Summary line of the newest incident."""

    def to_dict(self) -> dict:
        """JSON-able: paths as strings, tuples as lists, each class with its ``wall_lost_s``."""
        return {
            "run_dir": str(self.run_dir), "name": self.name, "state": self.state,
            "subruns": [dataclasses.asdict(sub) | {"incident_ids": list(sub.incident_ids)} for sub in self.subruns],
            "summary": dict(self.summary), "costs": [cost.to_dict() for cost in self.costs],
            "mtbi_s": self.mtbi_s, "ettr_series": [list(point) for point in self.ettr_series],
            "last_incident": self.last_incident,
        }


def run_report(book: Logbook) -> RunReport:
    """The report of an open logbook, read in one snapshot (a live run's driver
    may write meanwhile); metrics are read as SQL aggregates, never row by row."""
    with book.snapshot():
        lineage, events, books = book.lineage(), book.events(), book.ledger()
        summary = book.summary(books)
    incidents = [event for event in events if event["type"] == "incident"]
    subruns = tuple(_subrun_report(sub, books.costs[sub.id], books.reached[sub.id],
                                   tuple(e["id"] for e in incidents if e["subrun"] == sub.id)) for sub in lineage)
    return RunReport(
        run_dir=book.run_dir, name=book.run_dir.name, state=_state(lineage), subruns=subruns, summary=summary,
        costs=tuple(class_costs(lineage, books.costs, events)), mtbi_s=mtbi(lineage, events, summary["wall_time_s"]),
        ettr_series=books.ettr_series, last_incident=_summary_of(last_driving_incident(events)),
    )


def last_driving_incident(events: list[dict]) -> Optional[dict]:
    """The incident behind the last decision that acted (a restart, a rollback); with none, the
    last recorded: an ignored grad-norm blip after a rollback does not stand for the run."""
    incidents = [e for e in events if e["type"] == "incident"]
    acted = {e["incident_id"] for e in events if e["type"] == "decision" and e["action"] != "ignore"}
    driving = [e for e in incidents if e["id"] in acted] or incidents
    return driving[-1] if driving else None


def _summary_of(incident: Optional[dict]) -> Optional[str]:
    return incident["summary"] if incident is not None else None


def _subrun_report(sub: SubRun, cost: SubRunCost, reached: int, incident_ids: tuple[int, ...]) -> SubRunReport:
    return SubRunReport(
        id=sub.id, started_at=sub.started_at, ended_at=sub.ended_at, start_step=sub.start_step, last_step=reached,
        end_state=sub.end_state, cause=sub.cause, start_checkpoint=sub.start_checkpoint, plan=sub.plan,
        config_diff=sub.config_diff, lost_steps=cost.lost_steps, downtime_s=cost.downtime, restart_s=cost.restart,
        incident_ids=incident_ids, redone_s=cost.lost_step_time, paused_s=cost.paused,
    )


def _state(lineage: list[SubRun]) -> str:
    if not lineage:
        return EMPTY_STATE
    return lineage[-1].end_state or OPEN_STATE
