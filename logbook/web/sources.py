"""What the page shows, read from a logbook through its public API.

These small functions are the seams where the shared report
(``logbook.report.run_report``) plugs in: each returns plain data the
templates and the JSON endpoints render (the curves: logbook/web/curves_json.py).
"""

from __future__ import annotations

from typing import Optional, Sequence

from logbook.plot_style import subrun_colours
from logbook.report import last_driving_incident
from logbook.store import Logbook
from logbook.web.incident_view import label


def run_state(summary: dict) -> str:
    """``running`` while the last sub-run has no end, else how it ended (``empty`` with none)."""
    if not summary["subruns"]:
        return "empty"
    return summary["last_state"] or "running"


def last_incident(events: Sequence[dict]) -> Optional[dict]:
    """The incident behind the last decision that acted, as ``runmgr logbook list`` names it (id,
    kind, step, summary, sub-run, and the ``label`` the page shows), or None."""
    newest = last_driving_incident(list(events))
    if newest is None:
        return None
    return {**{key: newest[key] for key in ("id", "kind", "step", "summary", "subrun")},
            "label": label(newest["kind"], newest["summary"])}


def overview(book: Logbook, events: Optional[Sequence[dict]] = None) -> dict:
    """The figures of the runs list and of the live poll: state, sub-runs, last step, ETTR, last incident."""
    summary = book.summary()
    events = book.events() if events is None else events
    return {"state": run_state(summary), "live": summary["subruns"] > 0 and summary["last_state"] is None,
            "subruns": summary["subruns"], "last_step": summary["last_step"], "ettr": summary["ettr"],
            "steps_lost": summary["steps_lost"], "wall_time_s": summary["wall_time_s"],
            "incidents": summary["incidents"], "last_incident": last_incident(events)}


def timeline(book: Logbook, events: Sequence[dict]) -> list[dict]:
    """Each sub-run (as the logbook keeps it) with the records made during it, in order."""
    costs = book.costs()
    by_subrun: dict[str, list[dict]] = {}
    for event in events:
        if event["type"] not in ("subrun_start", "subrun_end"):
            by_subrun.setdefault(event["subrun"], []).append(event)
    lineage = book.lineage()
    colours = subrun_colours([subrun.id for subrun in lineage])  # the curves' and the PNG's colours
    return [{"subrun": subrun, "cost": costs.get(subrun.id), "events": by_subrun.get(subrun.id, []),
             "colour": colours[subrun.id]} for subrun in lineage]
