"""The interactive HTML of ``runmgr logbook plot --html``: bokeh, with its
JavaScript inside the file (``bokeh.resources.INLINE``), so the page works
with no network and fetches nothing when opened.

The same panels as the PNG; hovering a curve names its sub-run and step,
hovering an incident's marker shows its kind and summary. Every string from
the run goes into the page as data (bokeh's JSON document, drawn as text),
never as HTML.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional, Sequence

from bokeh.embed import file_html
from bokeh.layouts import column
from bokeh.models import (BoxAnnotation, ColumnDataSource, HoverTool, Legend, LegendItem, PlainText, Range1d, Span,
                          Title)
from bokeh.plotting import figure
from bokeh.resources import INLINE

from logbook.plot_style import FADED_ALPHA, kind_colours, legend_entries, subrun_colours

WIDTH_PX = 1150
PANEL_PX = 260
TOOLS = "xpan,xwheel_zoom,box_zoom,reset,save"


def render_html(figures: Sequence[dict], path: Path) -> Path:
    """Write the panels of :func:`logbook.plot.figures_data` as one self-contained page."""
    colours = subrun_colours(figures[0]["subruns"])
    kinds = kind_colours(figures[0]["incidents"])
    panels = []
    for data in figures:
        x_range = panels[0].x_range if panels else _x_range(data)
        panels.append(_panel(data, colours, kinds, x_range, legend=not panels))
    panels[-1].xaxis.axis_label = figures[0]["x_label"]
    path.parent.mkdir(parents=True, exist_ok=True)
    page = file_html(column(*panels), INLINE, title=figures[0]["title"])
    path.write_text(page, encoding="utf-8")
    return path


def _x_range(data: dict) -> Range1d:
    xs = [x for segment in data["segments"] for x in segment["x"] if x is not None]
    low, high = (min(xs), max(xs)) if xs else (0, 1)
    return Range1d(low, high if high > low else low + 1)


def _panel(data: dict, colours: dict, kinds: dict, x_range: Range1d, legend: bool):
    log = data["log_y"] and any(v is not None and v > 0 for s in data["segments"] for v in s["values"])
    panel = figure(width=WIDTH_PX, height=PANEL_PX, x_range=x_range, y_axis_type="log" if log else "linear",
                   tools=TOOLS)
    if legend:
        # PlainText: a run name holding $$...$$ would otherwise be TeX, which bokeh fetches MathJax for.
        panel.title = Title(text=PlainText(text=data["title"]))
    panel.yaxis.axis_label = data["axis_label"] + (" (log)" if log else "")
    half_step = 0.5 if data["x_axis"] == "step" else 0.0
    for window in data["skip_windows"]:
        if window["first_x"] is None or window["last_x"] is None:
            continue
        panel.add_layout(BoxAnnotation(left=window["first_x"] - half_step, right=window["last_x"] + half_step,
                                       fill_color="#7f7f7f", fill_alpha=0.2, line_color="#7f7f7f", line_alpha=0.6))
    lines = {kept: _lines(panel, data, colours, kept) for kept in (False, True)}
    panel.add_tools(HoverTool(renderers=[r for r in lines.values() if r is not None],
                              tooltips=[("sub-run", "@subrun"), ("", "@state"), (data["x_axis"], "$x{0,0.[00]}"),
                                        ("value", "$y")]))
    markers = _incident_markers(panel, data, kinds)
    if legend:
        _legend(panel, data, colours, lines[True], markers)
    return panel


def _lines(panel, data: dict, colours: dict, kept: bool):
    segments = [s for s in data["segments"] if s["kept"] == kept and s["steps"]]
    if not segments:
        return None
    source = ColumnDataSource({
        "xs": [s["x"] for s in segments],
        "ys": [[math.nan if v is None else v for v in s["values"]] for s in segments],
        "colour": [colours[s["subrun"]] for s in segments],
        "subrun": [s["subrun"] for s in segments],
        "state": ["kept" if kept else "thrown away by a rollback"] * len(segments),
    })
    return panel.multi_line("xs", "ys", source=source, line_color="colour",
                            line_alpha=1.0 if kept else FADED_ALPHA, line_width=1.6 if kept else 1.0)


def _incident_markers(panel, data: dict, kinds: dict):
    """A dashed line per incident and a marker at the top of the data to hover."""
    incidents = [mark for mark in data["incidents"] if mark["x"] is not None]
    if not incidents:
        return None
    for mark in incidents:
        panel.add_layout(Span(location=mark["x"], dimension="height", line_color=kinds[mark["kind"]],
                              line_dash="dashed", line_width=1))
    top = _top(data)
    source = ColumnDataSource({
        "x": [m["x"] for m in incidents], "step": [m["step"] for m in incidents], "y": [top] * len(incidents),
        "kind": [m["kind"] for m in incidents], "summary": [m["label"] for m in incidents],
        "subrun": [m["subrun"] for m in incidents], "colour": [kinds[m["kind"]] for m in incidents],
    })
    markers = panel.scatter("x", "y", source=source, marker="inverted_triangle", size=10, color="colour")
    panel.add_tools(HoverTool(renderers=[markers], tooltips=[
        ("incident", "@kind"), ("step", "@step{0,0}"), ("sub-run", "@subrun"), ("", "@summary")]))
    return markers


def _top(data: dict) -> float:
    values = [v for s in data["segments"] for v in s["values"] if v is not None and (v > 0 or not data["log_y"])]
    return max(values) if values else 1.0


def _legend(panel, data: dict, colours: dict, kept_lines, markers: Optional[object]) -> None:
    items = []
    if kept_lines is not None:
        subruns = [s["subrun"] for s in data["segments"] if s["kept"] and s["steps"]]
        for label, subrun in legend_entries(data["subruns"]):
            if subrun in subruns:
                items.append(LegendItem(label=label, renderers=[kept_lines], index=subruns.index(subrun)))
    if markers is not None:
        items.append(LegendItem(label="incident (hover for details)", renderers=[markers]))
    if items:
        panel.add_layout(Legend(items=items, label_text_font_size="8pt"), "right")
