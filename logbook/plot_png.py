"""The PNG of ``runmgr logbook plot``: matplotlib's object API on the Agg canvas
(no pyplot, no display), one panel per metric sharing the step axis.

Drawing rules: each sub-run its own colour (a qualitative palette, cycling);
kept steps solid, steps a later rollback threw away faded and thinner;
incidents as dashed vertical lines coloured by kind, labelled once per kind
and cluster in the top panel; skipped data windows shaded grey.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import StrMethodFormatter
from matplotlib.transforms import blended_transform_factory

from logbook.plot_style import FADED_ALPHA, SUBRUN_COLOURS, kind_colours, legend_entries, subrun_colours

DPI = 100
WIDTH_IN = 14.0
PANEL_IN = 2.6
MARGIN_IN = 1.2
"""Title and step axis, besides the panels."""
KEPT_WIDTH, FADED_WIDTH = 1.4, 0.8
SKIP_COLOUR = "#7f7f7f"
CLUSTER_FRACTION = 0.02
"""Incidents of one kind closer than this fraction of the step axis share one label."""
MAX_LABELS = 30
"""More incident labels than this would pile up: the legend of kinds alone names them."""


def png_size(panels: int) -> tuple[int, int]:
    """(width, height) in pixels of a PNG of ``panels`` metrics."""
    return round(WIDTH_IN * DPI), round((PANEL_IN * panels + MARGIN_IN) * DPI)


def build_figure(figures: Sequence[dict]) -> Figure:
    """The figure of :func:`logbook.plot.figures_data`'s output (all of one run)."""
    figure = Figure(figsize=(WIDTH_IN, PANEL_IN * len(figures) + MARGIN_IN), dpi=DPI)
    FigureCanvasAgg(figure)
    axes = figure.subplots(len(figures), 1, sharex=True, squeeze=False)[:, 0]
    colours = subrun_colours(figures[0]["subruns"])
    kinds = kind_colours(figures[0]["incidents"])
    for ax, data in zip(axes, figures):
        _draw_panel(ax, data, colours, kinds)
    _label_incidents(axes[0], figures[0]["incidents"], kinds)
    axes[-1].set_xlabel("step")
    axes[-1].xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    figure.suptitle(figures[0]["title"], fontsize=13)
    figure.subplots_adjust(left=0.07, right=0.76, top=1 - 0.55 / figure.get_figheight(),
                           bottom=0.6 / figure.get_figheight(), hspace=0.12)
    figure.legend(handles=_legend_handles(figures[0]["subruns"], colours, kinds,
                                          bool(figures[0]["skip_windows"])),
                  loc="center left", bbox_to_anchor=(0.77, 0.5), fontsize=9, frameon=False)
    return figure


def render_png(figures: Sequence[dict], path: Path) -> Path:
    """Write the figure as a PNG of :func:`png_size`; returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    build_figure(figures).savefig(path, format="png", dpi=DPI)
    return path


def _draw_panel(ax: Axes, data: dict, colours: dict, kinds: dict) -> None:
    drawn = False
    for segment in data["segments"]:
        values = np.asarray([np.nan if v is None else v for v in segment["values"]], dtype=float)
        drawn |= bool(np.isfinite(values).any())
        ax.plot(segment["steps"], values, color=colours[segment["subrun"]],
                alpha=1.0 if segment["kept"] else FADED_ALPHA,
                linewidth=KEPT_WIDTH if segment["kept"] else FADED_WIDTH, zorder=3 if segment["kept"] else 2)
    for window in data["skip_windows"]:
        # An edge line keeps a window of a few steps visible on a 150,000-step axis.
        ax.axvspan(window["first_step"] - 0.5, window["last_step"] + 0.5, facecolor=SKIP_COLOUR, alpha=0.2,
                   edgecolor=SKIP_COLOUR, linewidth=0.8, zorder=1)
    for mark in data["incidents"]:
        ax.axvline(mark["step"], color=kinds[mark["kind"]], linestyle="--", linewidth=0.9, zorder=4)
    if data["log_y"] and _has_positive(data):
        ax.set_yscale("log")
    ax.set_ylabel(data["axis_label"] + (" (log)" if ax.get_yscale() == "log" else ""), fontsize=9)
    ax.grid(True, alpha=0.3, linewidth=0.5)
    if not drawn:
        ax.text(0.5, 0.5, f"no {data['metric']} recorded", transform=ax.transAxes, ha="center", va="center",
                color="#555555")


def _has_positive(data: dict) -> bool:
    return any(v is not None and v > 0 for segment in data["segments"] for v in segment["values"])


def _label_incidents(ax: Axes, incidents: Sequence[dict], kinds: dict) -> None:
    """One label per kind and cluster of nearby incidents, at the top of ``ax``."""
    if not incidents:
        return
    low, high = ax.get_xlim()
    reach = CLUSTER_FRACTION * (high - low)
    labels = []
    for kind in kinds:
        steps = sorted(mark["step"] for mark in incidents if mark["kind"] == kind)
        cluster = [steps[0]]
        for step in steps[1:]:
            if step - cluster[0] > reach:
                labels.append((cluster[0], kind, len(cluster)))
                cluster = []
            cluster.append(step)
        labels.append((cluster[0], kind, len(cluster)))
    if len(labels) > MAX_LABELS:
        return
    at_top = blended_transform_factory(ax.transData, ax.transAxes)
    for step, kind, count in labels:
        ax.text(step, 0.97, f" {kind}" + (f" ×{count}" if count > 1 else ""), transform=at_top, rotation=90,
                ha="left", va="top", fontsize=7, color=kinds[kind], zorder=5)


def _legend_handles(subruns: Sequence[str], colours: dict, kinds: dict, skipped: bool) -> list:
    entries = legend_entries(subruns)
    handles = [Line2D([], [], color=colours[s], linewidth=KEPT_WIDTH, label=label) for label, s in entries]
    if len(entries) < len(subruns):
        handles.insert(0, Line2D([], [], linestyle="none",
                                 label=f"{len(subruns)} sub-runs, colours cycling every {len(SUBRUN_COLOURS)}:"))
    handles.append(Line2D([], [], color="#444444", alpha=FADED_ALPHA * 2, linewidth=FADED_WIDTH,
                          label="faded: thrown away by a rollback"))
    if skipped:
        handles.append(Patch(facecolor=SKIP_COLOUR, alpha=0.3, label="skipped data window"))
    handles += [Line2D([], [], color=colour, linestyle="--", label=f"incident: {kind}")
                for kind, colour in kinds.items()]
    return handles
