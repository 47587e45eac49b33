"""What the page shows, read from a logbook through its public API.

These small functions are the seams where the shared report
(``logbook.report.run_report``) and curves (``logbook.curves.curves``) plug
in: each returns plain data the templates and the JSON endpoints render.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

from logbook.records import METRIC_FLOATS
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
    ``{"subrun", "kept", "steps", "values"}``, NaN and infinities as None."""
    lineage = book.lineage()
    rows = book.all_metrics()
    # A row of sub-run i survives when no later sub-run started below its step.
    cutoff: dict[str, float] = {}
    lowest_later = math.inf
    for subrun in reversed(lineage):
        cutoff[subrun.id] = lowest_later
        lowest_later = min(lowest_later, subrun.start_step)
    parts: dict[tuple[str, bool], tuple[list[int], list[Any]]] = {}
    for row in rows:
        steps, values = parts.setdefault((row["subrun"], row["step"] <= cutoff[row["subrun"]]), ([], []))
        steps.append(row["step"])
        values.append(row[metric])
    budget = max(2, max_points // max(1, len(parts)))
    return [{"subrun": subrun, "kept": kept, **envelope(steps, values, budget)}
            for (subrun, kept), (steps, values) in parts.items()]


def envelope(steps: Sequence[int], values: Sequence[Any], budget: int) -> dict:
    """At most about ``budget`` points: each bucket of steps keeps its lowest and highest value."""
    clean = [None if value is None or not math.isfinite(value) else value for value in values]
    if len(steps) <= budget:
        return {"steps": list(steps), "values": clean}
    size = math.ceil(len(steps) / (budget // 2))
    out_steps: list[int] = []
    out_values: list[Any] = []
    for start in range(0, len(steps), size):
        bucket = [(s, v) for s, v in zip(steps[start:start + size], clean[start:start + size]) if v is not None]
        if not bucket:
            out_steps.append(steps[start])
            out_values.append(None)
            continue
        low, high = min(bucket, key=lambda p: p[1]), max(bucket, key=lambda p: p[1])
        for step, value in sorted({low, high}):
            out_steps.append(step)
            out_values.append(value)
    return {"steps": out_steps, "values": out_values}
