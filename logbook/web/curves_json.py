"""The curves of the run page as plain JSON-able data: each metric's segments
(the same downsampled curves the PNG draws, logbook/plot.py) placed on the x
axis the reader picked, step, wall-clock or tokens, and every incident of the
run as a marker with what a person hovering it wants to read.

The data is shaped as the columns of the page's bokeh sources
(logbook/web/figures.py names them), so a live refresh replaces a source's
columns in the browser without drawing the page again.
"""

from __future__ import annotations

import bisect
import math
import sqlite3
import time
from dataclasses import dataclass
from typing import Optional, Sequence

from logbook.errors import LogbookError
from logbook.plot import AXIS_LABELS, LOG_SCALE, PLOT_METRICS, figures_data
from logbook.plot_style import FADED_ALPHA, kind_colours, subrun_colours
from logbook.records import decode_float
from logbook.store import Logbook
from logbook.textfmt import clock_text

X_AXES = {"step": "step", "wall": "wall-clock (local time)", "tokens": "tokens trained"}
"""The x axes a reader can pick, with their labels (the names of ``runmgr logbook plot --x``)."""
DEFAULT_METRICS = ("loss", "grad_norm", "lr", "tokens_per_s")
"""The panels drawn unless the page's ``metrics=`` says otherwise."""
TOOLTIP_CHARS = 90
"""A summary or decision is cut here in a tooltip, which does not wrap (the incident's page has it whole)."""


@dataclass(frozen=True)
class StepPlace:
    """Where one recorded step sits on the other x axes."""

    time_ms: float
    """Local wall-clock time in ms, as bokeh's datetime axis reads it (it prints UTC: see :func:`local_ms`)."""
    tokens: Optional[int]
    """Tokens trained up to and including this step along the lineage it belongs to."""


def parse_view(x: Optional[str], metrics: Optional[str]) -> tuple[str, tuple[str, ...]]:
    """The page's ``x=`` and ``metrics=`` checked; a LogbookError names what is accepted."""
    x = x or "step"
    if x not in X_AXES:
        raise LogbookError(f"no x axis {x!r}: pick one of {', '.join(X_AXES)}")
    names = tuple(n.strip() for n in metrics.split(",") if n.strip()) if metrics else DEFAULT_METRICS
    unknown = [n for n in names if n not in PLOT_METRICS]
    if unknown or not names:
        raise LogbookError(f"no metric {', '.join(map(repr, unknown)) or '(none named)'}: "
                           f"pick from {', '.join(PLOT_METRICS)}, comma-separated")
    return x, tuple(dict.fromkeys(names))


def local_ms(timestamp: float) -> float:
    """``timestamp`` shifted by this machine's UTC offset, in ms: bokeh prints datetimes as
    UTC, so the axis then reads the same local time as the timeline beside it."""
    offset = time.localtime(timestamp).tm_gmtoff
    return (timestamp + offset) * 1000.0


def step_places(connection: sqlite3.Connection) -> dict[tuple[str, int], StepPlace]:
    """(sub-run, step) -> its place on the time and token axes, for every metrics row.

    Tokens add up along the lineage: a sub-run starts from the total of the newest earlier
    sub-run that recorded its start step (the one it resumed from), so the steps a rollback
    threw away and their re-run sit at the same token counts."""
    query = ("SELECT m.subrun_id, m.step, m.time, m.recorded_at, m.tokens, s.start_step FROM metrics m "
             "JOIN subrun_starts s ON s.subrun_id = m.subrun_id ORDER BY s.idx, m.step")
    places: dict[tuple[str, int], StepPlace] = {}
    total_at: dict[int, Optional[int]] = {}  # step -> tokens up to it, the newest sub-run's
    current, running = None, None
    for subrun, step, when, recorded, tokens, start in connection.execute(query):
        if subrun != current:
            current, running = subrun, (total_at.get(start, 0) if start else 0)
        running = None if running is None or tokens is None else running + tokens
        total_at[step] = running
        stamp = decode_float(when)
        places[(subrun, step)] = StepPlace(local_ms(stamp if stamp is not None and math.isfinite(stamp)
                                                    else recorded), running)
    return places


def _x_of(x: str, subrun: str, step: int, places: dict) -> Optional[float]:
    if x == "step":
        return float(step)
    place = places.get((subrun, step))
    if place is None:
        return None
    return place.time_ms if x == "wall" else (None if place.tokens is None else float(place.tokens))


def _nearest_place(subrun: str, step: int, steps_of: dict[str, list[int]]) -> Optional[tuple[str, int]]:
    """The recorded step of ``subrun`` at or before ``step`` (else its first): where an incident sits."""
    own = steps_of.get(subrun)
    if not own:
        return None
    at = bisect.bisect_right(own, step)
    return subrun, own[at - 1] if at else own[0]


def incident_marks(events: Sequence[dict], lineage: Sequence, reached: dict[str, int]) -> list[dict]:
    """Every incident with the step it is drawn at: its own, else where its sub-run stopped
    (a worker's death has no step), else the last step recorded, else where the sub-run began.
    None is left out: each kind the PNG shows is on the page too."""
    starts = {s.id: s.start_step for s in lineage}
    ends = {s.id: s.last_step for s in lineage}
    decisions = {e["incident_id"]: e for e in events if e["type"] == "decision"}
    marks = []
    for event in events:
        if event["type"] != "incident":
            continue
        subrun = event["subrun"]
        step = next((s for s in (event["step"], ends.get(subrun), reached.get(subrun), starts.get(subrun))
                     if s is not None), 0)
        decision = decisions.get(event["id"])
        marks.append({"id": event["id"], "kind": str(event["kind"]), "subrun": subrun, "step": int(step),
                      "time": event["time"], "summary": str(event["summary"]), "exact": event["step"] is not None,
                      "decision": _decision_text(decision)})
    return marks


def _decision_text(decision: Optional[dict]) -> str:
    if decision is None:
        return "none recorded"
    return cut(f"{decision['action']}: {decision['reason']}")


def cut(text: str) -> str:
    """``text`` up to :data:`TOOLTIP_CHARS`, an ellipsis saying where it was cut."""
    return text if len(text) <= TOOLTIP_CHARS else text[:TOOLTIP_CHARS - 1] + "…"


def run_curves(book: Logbook, x: str, metrics: Sequence[str]) -> dict:
    """What the page draws: ``x``, ``metrics``, ``subruns`` and their ``colours`` (the PNG's),
    ``kinds`` and their colours, per metric ``panels`` (label, log y), ``sources`` (the columns
    of each bokeh source by name), ``skip_windows`` on this x axis and ``shape`` (changes when a
    sub-run, kind or skip window is added: the browser then draws the figure anew)."""
    with book.snapshot():
        lineage, events = book.lineage(), book.events()
        if not lineage:
            return _empty(x, metrics)
        figures = figures_data(book, metrics)
        places = book.query(step_places) if x != "step" else {}
        reached = {sid: step for (sid, step) in sorted(places)} if places else _reached(figures)
    if x == "tokens" and places and all(p.tokens is None for p in places.values()):
        raise LogbookError("this run recorded no token counts per step: pick x=step or x=time")
    subruns = [s.id for s in lineage]
    marks = incident_marks(events, lineage, reached)
    sources = {}
    for data in figures:
        for kept in (True, False):
            sources[f"{'kept' if kept else 'lost'}-{data['metric']}"] = _lines(data, kept, x, places)
    sources["incidents"] = _incident_columns(marks, x, places)
    kinds = sorted({m["kind"] for m in marks})
    windows = [w for w in (_window(w, x, places) for w in figures[0]["skip_windows"]) if w]
    return {"x": x, "x_label": X_AXES[x], "metrics": list(metrics), "subruns": subruns,
            "colours": subrun_colours(subruns), "kinds": kinds, "kind_colours": kind_colours(marks),
            "panels": [{"metric": d["metric"], "label": AXIS_LABELS[d["metric"]], "log": d["metric"] in LOG_SCALE}
                       for d in figures],
            "sources": sources, "skip_windows": windows, "title": figures[0]["title"],
            "shape": "|".join([",".join(subruns), ",".join(kinds), str(len(windows))])}


def _reached(figures: list[dict]) -> dict[str, int]:
    reached: dict[str, int] = {}
    for segment in figures[0]["segments"]:
        if segment["steps"]:
            reached[segment["subrun"]] = max(reached.get(segment["subrun"], 0), segment["steps"][-1])
    return reached


def _empty(x: str, metrics: Sequence[str]) -> dict:
    return {"x": x, "x_label": X_AXES[x], "metrics": list(metrics), "subruns": [], "colours": {}, "kinds": [],
            "kind_colours": {}, "panels": [], "sources": {}, "skip_windows": [], "title": "", "shape": ""}


def _lines(data: dict, kept: bool, x: str, places: dict) -> dict:
    """One multi_line source: a line per segment (kept or thrown away) of one metric."""
    colours = subrun_colours(data["subruns"])
    xs, ys, subrun_ids, colour = [], [], [], []
    for segment in data["segments"]:
        if segment["kept"] != kept or not segment["steps"]:
            continue
        points = [(_x_of(x, segment["subrun"], step, places), value)
                  for step, value in zip(segment["steps"], segment["values"])]
        points = [(px, v) for px, v in points if px is not None]
        xs.append([px for px, _ in points])
        ys.append([math.nan if v is None else v for _, v in points])
        subrun_ids.append(segment["subrun"])
        colour.append(colours[segment["subrun"]])
    state = "kept" if kept else "thrown away by a rollback"
    return {"xs": xs, "ys": ys, "subrun": subrun_ids, "colour": colour, "state": [state] * len(xs),
            "alpha": [1.0 if kept else FADED_ALPHA] * len(xs)}


def _incident_columns(marks: list[dict], x: str, places: dict) -> dict:
    colours = kind_colours(marks)
    steps_of: dict[str, list[int]] = {}
    for subrun, step in places:  # rows come by sub-run then step: each list is sorted
        steps_of.setdefault(subrun, []).append(step)
    columns: dict[str, list] = {key: [] for key in ("x", "id", "kind", "subrun", "step", "when", "decision",
                                                    "summary", "colour")}
    for mark in marks:
        if x == "wall":
            where: Optional[float] = local_ms(mark["time"])
        else:
            near = _nearest_place(mark["subrun"], mark["step"], steps_of) if x == "tokens" else None
            where = float(mark["step"]) if x == "step" else (None if near is None else _x_of(x, *near, places))
        if where is None:
            where = math.nan  # kept in the table of sources, drawn nowhere: no token count to place it at
        step = str(mark["step"]) if mark["exact"] else f"{mark['step']} (where the sub-run stopped)"
        for key, value in (("x", where), ("id", mark["id"]), ("kind", mark["kind"]), ("subrun", mark["subrun"]),
                           ("step", step), ("when", clock_text(mark["time"], with_date=True)),
                           ("decision", mark["decision"]), ("summary", cut(mark["summary"])),
                           ("colour", colours[mark["kind"]])):
            columns[key].append(value)
    return columns


def _window(window: dict, x: str, places: dict) -> Optional[dict]:
    """A skipped data window's two ends on the x axis (None where they cannot be placed)."""
    left = _x_of(x, window["subrun"], window["first_step"], places) if x != "step" else window["first_step"] - 0.5
    right = _x_of(x, window["subrun"], window["last_step"], places) if x != "step" else window["last_step"] + 0.5
    if x != "step":
        lefts = [_x_of(x, sid, window["first_step"], places) for sid, _ in places if _ == window["first_step"]]
        rights = [_x_of(x, sid, window["last_step"], places) for sid, _ in places if _ == window["last_step"]]
        left = left if left is not None else next((v for v in lefts if v is not None), None)
        right = right if right is not None else next((v for v in rights if v is not None), None)
    if left is None or right is None:
        return None
    return {"left": left, "right": right, "samples": window["samples"]}
