"""The run page's interactive curves as a bokeh document (``json_item``) the
page's script embeds with BokehJS, served from bokeh's own package (no CDN).

Layout: a strip of incidents on top, one row per kind (markers never pile
their labels onto each other: hovering one shows its kind, sub-run, step,
time and decision; clicking opens its page), then one panel per metric, all
sharing the x range (a zoom in one zooms all). Sub-runs have the PNG's
colours (logbook/plot_style.py); steps a rollback threw away are faded.
Every model the live refresh touches has a name: ``x`` (the shared range),
``kinds`` (the strip's rows) and each source by its key in
:func:`logbook.web.curves_json.run_curves`'s ``sources``.
"""

from __future__ import annotations

from typing import Sequence
from urllib.parse import quote

from bokeh.embed import json_item
from bokeh.layouts import gridplot
from bokeh.models import (BoxAnnotation, ColumnDataSource, DataRange1d, FactorRange, HoverTool, NumeralTickFormatter,
                          OpenURL, PlainText, TapTool, Title)
from bokeh.plotting import figure

STRIP_ROW_PX = 22
PANEL_PX = 210
TOOLS = "xpan,xbox_zoom,xwheel_zoom,reset,save"
"""Every tool zooms or pans the shared x axis only: each panel keeps its y axis fitted."""


def layout_item(curves: dict, run: str) -> dict:
    """The bokeh ``json_item`` of ``curves`` (:func:`run_curves`' output) for ``run``'s page."""
    sources = {name: ColumnDataSource(columns, name=name) for name, columns in curves["sources"].items()}
    x_range = DataRange1d(name="x", range_padding=0.02)
    strip = _strip(curves, sources["incidents"], x_range, run)
    panels = [_panel(curves, spec, sources, x_range) for spec in curves["panels"]]
    for panel in panels[:-1]:
        panel.xaxis.major_label_text_font_size = "0pt"  # one x axis reads for all: the bottom one's
    panels[-1].xaxis.axis_label = curves["x_label"]
    return json_item(_stack([strip, *panels], "curves"))


def _stack(panels: list, name: str):
    """The panels one above the other with one toolbar for all (a zoom tool acts on every panel)."""
    grid = gridplot([[panel] for panel in panels], merge_tools=True, toolbar_location="right",
                    sizing_mode="stretch_width")
    grid.name = name
    return grid


def _figure(curves: dict, x_range, height: int, **options):
    kind = "datetime" if curves["x"] == "wall" else "linear"
    panel = figure(height=height, sizing_mode="stretch_width", x_range=x_range, x_axis_type=kind, tools=TOOLS,
                   active_drag="xbox_zoom", active_scroll="xwheel_zoom", **options)
    if curves["x"] == "tokens":
        panel.xaxis.formatter = NumeralTickFormatter(format="0.0a")
    panel.toolbar.logo = None
    return panel


def _strip(curves: dict, incidents: ColumnDataSource, x_range, run: str):
    """The incidents, one row per kind: hover for the details, click for the incident's page."""
    kinds = curves["kinds"] or ["(no incident)"]
    strip = _figure(curves, x_range, height=40 + STRIP_ROW_PX * len(kinds),
                    y_range=FactorRange(factors=list(kinds), name="kinds"), name="strip")
    # PlainText: a run name holding $$...$$ would otherwise be TeX, which bokeh fetches MathJax for.
    strip.title = Title(text=PlainText(text=f"{curves['title']} — incidents (hover for details, click to open)"))
    markers = strip.scatter("x", "kind", source=incidents, marker="inverted_triangle", size=13, color="colour",
                            line_color="#222222", name="incident-markers")
    strip.add_tools(HoverTool(renderers=[markers], tooltips=[
        ("incident", "@kind"), ("sub-run", "@subrun"), ("step", "@step"), ("when", "@when"),
        ("decision", "@decision"), ("", "@summary")]))
    opening = OpenURL(url=f"/run/{quote(run)}/incident/@id", same_tab=True)
    strip.add_tools(TapTool(renderers=[markers], callback=opening))
    strip.xaxis.visible = False
    strip.ygrid.grid_line_color = None
    return strip


def _panel(curves: dict, spec: dict, sources: dict, x_range):
    """One metric against the shared x axis: kept lines solid, thrown-away ones faded,
    each incident a dashed line in its kind's colour, skipped data windows shaded."""
    panel = _figure(curves, x_range, height=PANEL_PX, y_axis_type="log" if spec["log"] else "linear",
                    name=f"panel-{spec['metric']}")
    panel.yaxis.axis_label = spec["label"] + (" (log)" if spec["log"] else "")
    for window in curves["skip_windows"]:
        panel.add_layout(BoxAnnotation(left=window["left"], right=window["right"], fill_color="#7f7f7f",
                                       fill_alpha=0.2, line_color="#7f7f7f", line_alpha=0.6))
    panel.vspan(x="x", source=sources["incidents"], line_color="colour", line_dash="dashed", line_alpha=0.7)
    lines = [panel.multi_line("xs", "ys", source=sources[f"{state}-{spec['metric']}"], line_color="colour",
                              line_alpha="alpha", line_width=width, name=f"{state}-{spec['metric']}-lines")
             for state, width in (("lost", 1.0), ("kept", 1.8))]
    panel.add_tools(HoverTool(renderers=lines, formatters={"$x": "datetime"} if curves["x"] == "wall" else {},
                              tooltips=[("sub-run", "@subrun"), ("", "@state"),
                                        ("x", "$x{%F %T}" if curves["x"] == "wall" else "$x{0,0}"),
                                        (spec["metric"], "$y")]))
    return panel


def overlay_item(title: str, lines: Sequence[dict], metrics: Sequence[str], labels: dict) -> dict:
    """Two runs' curves on one axis per metric (the compare page): ``lines`` are
    ``{"run", "metric", "steps", "values", "colour", "dash", "width"}``."""
    x_range = DataRange1d(name="x", range_padding=0.02)
    panels = []
    for metric in metrics:
        panel = figure(height=260, sizing_mode="stretch_width", x_range=x_range, tools=TOOLS,
                       active_drag="xbox_zoom", active_scroll="xwheel_zoom")
        panel.toolbar.logo = None
        if not panels:
            panel.title = Title(text=PlainText(text=title))
        drawn = []
        for line in (ln for ln in lines if ln["metric"] == metric):
            columns = {"x": line["steps"], "y": line["values"], "run": [line["run"]] * len(line["steps"])}
            source = ColumnDataSource(columns, name=f"{line['run']}-{metric}")
            drawn.append(panel.line("x", "y", source=source, line_color=line["colour"], line_width=line["width"],
                                    line_dash=line["dash"], legend_label=line["run"]))
        panel.add_tools(HoverTool(renderers=drawn, tooltips=[("run", "@run"), ("step", "@x{0,0}"), (metric, "@y")]))
        panel.yaxis.axis_label = labels[metric]
        panel.legend.location = "top_right"
        panel.legend.visible = not panels  # one legend, on the top panel: the others' lines stay uncovered
        panels.append(panel)
    panels[-1].xaxis.axis_label = "step"
    return json_item(_stack(panels, "overlay"))
