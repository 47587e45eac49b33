"""What ``runmgr logbook plot`` draws: each metric against step (or tokens
trained, or wall-clock time: logbook/plot_x.py), one colour per sub-run, the
steps a later rollback threw away faded, incidents marked by kind, skipped
data windows shaded. :func:`figure_data` is the one description
both pictures draw (the PNG in logbook/plot_png.py, the self-contained HTML in
logbook/plot_html.py); it is plain JSON-able data, so a web page can draw it too.

Curves are downsampled for drawing (at most :data:`MAX_POINTS` points per
metric in all) keeping each bucket's minimum and maximum, so a one-step spike
never disappears from a 150,000-step run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from logbook.accounting import split_metrics
from logbook.changes import skip_ranges
from logbook.curves import Segment, curves
from logbook.errors import LogbookError
from logbook.plot_x import XAxis, x_axis
from logbook.queries import stream_positions
from logbook.records import SubRun
from logbook.render import run_title
from logbook.store import Logbook

PLOT_METRICS = ("loss", "grad_norm", "lr", "loss_scale", "tokens_per_s", "step_time")
"""Metrics that can be plotted (the per-step float columns of the logbook)."""
DEFAULT_METRICS = ("loss", "grad_norm", "lr", "loss_scale")
"""What ``runmgr logbook plot`` draws unless ``--metric`` says otherwise (the loss scale only
where the run scaled its loss: :func:`default_metrics`)."""
UNSCALED_NOTE = ("loss scale not drawn: 1 at every step (a bf16 or fp32 run scales no loss); "
                 "--metric loss_scale draws it")
"""What the picture says when :func:`default_metrics` leaves the loss scale out."""
MAX_POINTS = 4000
"""Points drawn per metric, all sub-runs together (min/max envelope beyond it)."""
AXIS_LABELS = {"loss": "loss (nats/token)", "grad_norm": "gradient norm (L2)", "lr": "learning rate",
               "loss_scale": "loss scale", "tokens_per_s": "throughput (tokens/s)",
               "step_time": "step time (s)"}
"""Each metric's axis label: its name and unit."""
LOG_SCALE = frozenset({"grad_norm", "loss_scale"})
"""Metrics drawn on a log y axis: loss scales move by powers of two, gradient norms spike by decades."""
@dataclass(frozen=True)
class _RunRows:
    """What one plot command reads from the logbook, once for all its metrics."""

    lineage: list[SubRun]
    rows: list[dict]
    kept_ids: frozenset[int]
    """``id()`` of each row the kept lineage holds (the others were thrown away)."""
    events: list[dict]
    x: XAxis


def parse_metrics(text: str) -> tuple[str, ...]:
    """``"loss,lr"`` as metric names, refused with one line when unknown or repeated."""
    names = tuple(name.strip() for name in text.split(","))
    unknown = [name for name in names if name not in PLOT_METRICS]
    if unknown or not names:
        raise LogbookError(f"unknown metric {', '.join(repr(n) for n in unknown)}: "
                           f"choose from {','.join(PLOT_METRICS)} (comma-separated)")
    if len(set(names)) != len(names):
        raise LogbookError(f"--metric {text!r} names a metric twice: name each once")
    return names


def default_metrics(book: Logbook) -> tuple[tuple[str, ...], list[str]]:
    """(metrics, notes): :data:`DEFAULT_METRICS`, less the loss scale when no step recorded one
    other than 1. Only fp16 scales its loss (a dynamic scale from 2**16 that halves on overflow);
    bf16 and fp32 runs report 1 at every step, a flat line that takes a quarter of the picture.
    Decided from the recorded values, not the config: Megatron's and the built-in trainer's
    precision settings differ, and a flat 1 says nothing whatever the config was."""
    if book.query(_scales_loss):
        return DEFAULT_METRICS, []
    return tuple(m for m in DEFAULT_METRICS if m != "loss_scale"), [UNSCALED_NOTE]


def _scales_loss(connection) -> bool:
    # NaN and -0.0 are stored as text (logbook.records.encode_float), which is never = 1: drawn, a fault to see.
    found = connection.execute(
        "SELECT 1 FROM metrics WHERE loss_scale IS NOT NULL AND loss_scale != 1 LIMIT 1").fetchone()
    return found is not None


def figure_data(book: Logbook, metric: str, x: str = "step") -> dict:
    """What both pictures draw for ``metric``: see :func:`_figure` for the keys."""
    return figures_data(book, (metric,), x)[0]


def figures_data(book: Logbook, metrics: Sequence[str], x: str = "step", notes: Sequence[str] = ()) -> list[dict]:
    """:func:`figure_data` of several metrics against axis ``x`` (logbook.plot_x.X_AXES),
    reading the logbook once; ``notes``: lines the picture shows under its title."""
    if not metrics:
        raise LogbookError(f"name at least one metric to plot: {', '.join(PLOT_METRICS)}")
    for metric in metrics:
        if metric not in PLOT_METRICS:
            raise LogbookError(f"unknown metric {metric!r}: choose from {', '.join(PLOT_METRICS)}")
    loaded = _load(book, x)
    incidents = _incidents(loaded)
    windows = _skip_windows(loaded)
    title = run_title(loaded.lineage)
    if book.run_dir.name not in title:
        title = f"{book.run_dir.name} · {title}"
    figures = [_figure(title, metric, loaded, _segments(book, metric), incidents, windows) for metric in metrics]
    for figure in figures:
        figure["notes"] = list(notes)
    return figures


def write_png(book: Logbook, metrics: Sequence[str], path: str | Path, x: str = "step") -> Path:
    """Draw ``metrics`` (one panel each, sharing the x axis) into a PNG at ``path``."""
    from logbook.plot_png import render_png  # matplotlib: only for a command that draws

    return render_png(figures_data(book, metrics, x), Path(path))


def write_html(book: Logbook, metrics: Sequence[str], path: str | Path, x: str = "step") -> Path:
    """The same panels as an interactive HTML page with its JavaScript inside (works offline)."""
    from logbook.plot_html import render_html  # bokeh: only for a command that draws

    return render_html(figures_data(book, metrics, x), Path(path))


def write_plots(book: Logbook, metrics: Sequence[str], png: Path, html: Optional[Path] = None, x: str = "step",
                notes: Sequence[str] = ()) -> list[Path]:
    """:func:`write_png` and, with ``html``, :func:`write_html`, reading the logbook once."""
    from logbook.plot_png import render_png

    figures = figures_data(book, metrics, x, notes)
    written = [render_png(figures, Path(png))]
    if html is not None:
        from logbook.plot_html import render_html  # bokeh: only when a page is asked for

        written.append(render_html(figures, Path(html)))
    return written


def _figure(title: str, metric: str, loaded: _RunRows, segments: list, incidents: list[dict],
            windows: list[dict]) -> dict:
    """Keys: ``title``, ``metric``, ``axis_label``, ``log_y``, ``x_axis`` (step, tokens or wall),
    ``x_label``, ``subruns`` (ids, lineage order), ``segments`` ({subrun, kept, steps, x, values};
    a value is None where it is NaN or infinite), ``incidents`` ({step, x, kind, label, subrun}),
    ``skip_windows`` ({first_step, last_step, first_x, last_x, samples: [start, end), subrun}: the
    steps whose data the plan skipped); :func:`figures_data` adds ``notes``. ``x`` is the step
    on the step axis."""
    return {
        "title": title, "metric": metric, "axis_label": AXIS_LABELS[metric], "log_y": metric in LOG_SCALE,
        "x_axis": loaded.x.name, "x_label": loaded.x.label,
        "subruns": [subrun.id for subrun in loaded.lineage],
        "segments": [{"subrun": s.subrun, "kept": s.kept, "steps": [int(x) for x in s.steps],
                      "x": [loaded.x.at(s.subrun, int(x)) for x in s.steps],
                      "values": [_finite(v) for v in s.values]} for s in segments],
        "incidents": incidents, "skip_windows": windows,
    }


def _finite(value: Optional[float]) -> Optional[float]:
    # None, not NaN: JSON readers (a browser's JSON.parse) refuse NaN; a gap is drawn either way.
    return float(value) if value is not None and math.isfinite(value) else None


def _load(book: Logbook, x: str) -> _RunRows:
    """The lineage, events and x positions; each step's stream position only when a plan
    skipped data (the curves themselves come from logbook.curves, aggregated in SQL)."""
    with book.snapshot():
        lineage = book.lineage()
        if not lineage:
            raise LogbookError(f"the logbook at {book.run_dir} has no sub-runs yet: nothing to plot")
        rows = book.query(stream_positions) if any(skip_ranges(subrun.plan) for subrun in lineage) else []
        kept, _ = split_metrics(lineage, rows)
        return _RunRows(lineage, rows, frozenset(id(row) for row in kept), book.events(),
                        x_axis(book, lineage, x))


def _segments(book: Logbook, metric: str) -> list[Segment]:
    """The curve of ``metric`` as runs of steps of one sub-run, kept or thrown away, downsampled
    with each bucket's min and max kept (a one-step spike stays visible)."""
    return curves(book, metric, MAX_POINTS)


def _incidents(loaded: _RunRows) -> list[dict]:
    """Each incident at its step; one without a step sits where its sub-run stopped."""
    ends = {subrun.id: subrun.last_step for subrun in loaded.lineage}
    marks = []
    for event in loaded.events:
        if event["type"] != "incident":
            continue
        step = event.get("step") if event.get("step") is not None else ends.get(event["subrun"])
        if step is None:
            continue  # an incident of a sub-run still open, before its first step: nowhere to draw it
        marks.append({"step": int(step), "x": loaded.x.at(event["subrun"], int(step)), "kind": str(event["kind"]),
                      "label": str(event["summary"]), "subrun": event["subrun"]})
    return marks


def _skip_windows(loaded: _RunRows) -> list[dict]:
    """Each skip range of the plans (stream positions ``[start, end)``) as the steps that
    read it: from the first step whose ``consumed_samples`` passes the range's start to the
    first that reaches its end (or the last recorded). Read from the sub-run before the one
    that added the range (it trained that data: why it is skipped), else from the kept steps."""
    if not any(skip_ranges(subrun.plan) for subrun in loaded.lineage):
        return []
    kept = [row for row in loaded.rows if id(row) in loaded.kept_ids]
    by_subrun: dict[str, list[dict]] = {}
    for row in loaded.rows:
        by_subrun.setdefault(row["subrun"], []).append(row)
    windows, seen = [], set()
    for position, subrun in enumerate(loaded.lineage):
        previous = loaded.lineage[position - 1].id if position else None
        for start, end in skip_ranges(subrun.plan):
            if (start, end) in seen:
                continue
            seen.add((start, end))
            read = _rows_reading(by_subrun.get(previous, []), start, end) or _rows_reading(kept, start, end)
            if read is not None:  # else the run has not reached the range: nothing was skipped yet
                first, last = read
                windows.append({"first_step": first["step"], "last_step": last["step"],
                                "first_x": loaded.x.at(first["subrun"], first["step"]),
                                "last_x": loaded.x.at(last["subrun"], last["step"]),
                                "samples": [start, end], "subrun": subrun.id})
    return windows


def _rows_reading(rows: Sequence[dict], start: int, end: int) -> Optional[tuple[dict, dict]]:
    """The first and last of ``rows`` (one lineage, by step) whose samples include ``[start, end)``."""
    rows = [row for row in rows if row["consumed_samples"] is not None]
    consumed = np.asarray([row["consumed_samples"] for row in rows], dtype=np.int64)
    first = int(np.searchsorted(consumed, start, side="right"))
    if first >= len(rows):
        return None
    last = min(int(np.searchsorted(consumed, end, side="left")), len(rows) - 1)
    return rows[first], rows[last]
