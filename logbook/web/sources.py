"""What the page shows, read from a logbook through its public API.

These small functions are the seams where the shared report
(``logbook.report.run_report``) and curves (``logbook.curves.curves``) plug
in: each returns plain data the templates and the JSON endpoints render.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

from logbook.records import METRIC_FLOATS
from logbook.curves import curves
from logbook.store import Logbook

CURVE_METRICS = ("loss", "grad_norm", "lr", "loss_scale", "tokens_per_s", "step_time")
"""Metrics the page can draw (the columns of the metrics table that are per-step floats)."""
assert set(CURVE_METRICS) <= set(METRIC_FLOATS)
MAX_POINTS = 2000
"""Points per curve drawn; longer segments keep each bucket's min and max, so a spike stays visible."""


def run_state(summary: dict) -> str:
    """``running`` while the last sub-run has no end, else how it ended (``empty`` with none)."""
    if not summary["subruns"]:
        return "empty"
    return summary["last_state"] or "running"


def last_incident(events: Sequence[dict]) -> Optional[dict]:
    """The newest incident (id, kind, step, summary, sub-run), or None."""
    incidents = [event for event in events if event["type"] == "incident"]
    if not incidents:
        return None
    newest = incidents[-1]
    return {key: newest[key] for key in ("id", "kind", "step", "summary", "subrun")}


def incident_marks(events: Sequence[dict]) -> list[dict]:
    """Where the chart marks incidents: ``{"id", "step", "kind"}`` of each one with a step."""
    return [{"id": e["id"], "step": e["step"], "kind": e["kind"]}
            for e in events if e["type"] == "incident" and e["step"] is not None]


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
    return [{"subrun": subrun, "cost": costs.get(subrun.id), "events": by_subrun.get(subrun.id, [])}
            for subrun in book.lineage()]


def curve(book: Logbook, metric: str, max_points: int = MAX_POINTS) -> list[dict]:
    """Segments of ``metric`` against step, one per sub-run and kept/thrown-away part:
    ``{"subrun", "kept", "steps", "values"}``, downsampled with each bucket's min and max
    kept (logbook/curves.py), NaN and infinities as None (JSON has neither)."""
    return [{"subrun": segment.subrun, "kept": segment.kept, "steps": list(segment.steps),
             "values": [value if value is not None and math.isfinite(value) else None for value in segment.values]}
            for segment in curves(book, metric, max_points)]
