"""The PNG of ``runmgr logbook plot``: matplotlib's object API on the Agg canvas
(no pyplot, no display), one panel per metric sharing the x axis (step, tokens
trained or wall-clock time: logbook/plot_x.py).

Drawing rules: each sub-run its own colour (a qualitative palette, cycling);
kept steps solid, steps a later rollback threw away faded and thinner;
incidents as dashed vertical lines coloured by kind through every panel;
skipped data windows shaded grey.

Incident labels sit in a strip of their own above the panels, horizontal and
at a size a person reads, one per kind and cluster of nearby incidents
("loss_spike ×2"). Labels are placed in lanes: each goes into the lowest lane
where it keeps :data:`LABEL_GAP_PX` from the label before it, so no two ever
overlap; past :data:`MAX_LANES` lanes an incident keeps its line and its
colour in the legend, and the legend counts the unlabelled ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, StrMethodFormatter

from logbook.plot_style import FADED_ALPHA, SUBRUN_COLOURS, kind_colours, legend_entries, subrun_colours

DPI = 100
WIDTH_IN = 14.0
PANEL_IN = 2.6
MARGIN_IN = 1.2
"""Title and x axis, besides the panels."""
NOTE_IN = 0.22
"""Height of each note line under the title."""
LEFT, RIGHT = 0.07, 0.76
"""The panels' left and right edges, as fractions of the width (the legend is right of them)."""
KEPT_WIDTH, FADED_WIDTH = 1.4, 0.8
SKIP_COLOUR = "#7f7f7f"
CLUSTER_FRACTION = 0.02
"""Incidents of one kind closer than this fraction of the x axis share one label."""
LABEL_PT = 9.0
"""Incident labels' font size: the panels' axis labels' size, readable at 100 dpi."""
LABEL_OFFSET_PT = 3.0
"""Between an incident's line and its label."""
LABEL_PAD_PT = 1.5
"""The white box behind a label, so lines crossing the strip do not strike it through."""
LABEL_GAP_PX = 8.0
"""The least room between two labels of one lane."""
LANE_IN = 0.24
"""Height of one lane of labels."""
MAX_LANES = 4
"""Lanes of labels at most: past them a run's incidents are too dense to name one by one."""


@dataclass
class IncidentLabel:
    """One label of the strip: incidents of one kind close together, and where it goes."""

    x: float
    """The first incident's position on the x axis (its line)."""
    kind: str
    count: int
    lane: Optional[int] = None
    """0 is the lane next to the panels; None: no room, not written."""
    left_of_line: bool = False
    """Written left of its line (it would run past the panels' right edge otherwise)."""

    @property
    def text(self) -> str:
        return self.kind + (f" ×{self.count}" if self.count > 1 else "")


def png_size(panels: int, lanes: int = 0, notes: int = 0) -> tuple[int, int]:
    """(width, height) in pixels of a PNG of ``panels`` metrics, ``lanes`` lanes of incident
    labels and ``notes`` note lines."""
    return round(WIDTH_IN * DPI), round(_height_in(panels, lanes, notes) * DPI)


def _height_in(panels: int, lanes: int, notes: int) -> float:
    return PANEL_IN * panels + MARGIN_IN + _strip_in(lanes) + NOTE_IN * notes


def _strip_in(lanes: int) -> float:
    return LANE_IN * lanes + 0.1 if lanes else 0.0


def build_figure(figures: Sequence[dict]) -> Figure:
    """The figure of :func:`logbook.plot.figures_data`'s output (all of one run)."""
    first = figures[0]
    figure = Figure(figsize=(WIDTH_IN, PANEL_IN), dpi=DPI)
    FigureCanvasAgg(figure)
    colours = subrun_colours(first["subruns"])
    kinds = kind_colours(first["incidents"])
    limits = _x_limits(figures)
    labels = place_labels(incident_labels(first["incidents"], limits), limits, _text_width_px(figure))
    lanes = max((label.lane + 1 for label in labels if label.lane is not None), default=0)
    axes = _axes(figure, len(figures), lanes, len(first.get("notes", [])))
    panels = axes[1:] if lanes else axes
    for ax, data in zip(panels, figures):
        _draw_panel(ax, data, colours, kinds)
    if lanes:
        _draw_strip(axes[0], first["incidents"], labels, lanes, kinds)
    axes[-1].set_xlim(*limits)
    _x_ticks(axes[-1], first)
    _frame(figure, first, colours, kinds, sum(label.count for label in labels if label.lane is None))
    return figure


def _axes(figure: Figure, panels: int, lanes: int, notes: int) -> Sequence[Axes]:
    """The figure sized for its panels, label lanes and notes; the strip's axes first when it has lanes."""
    height = _height_in(panels, lanes, notes)
    figure.set_size_inches(WIDTH_IN, height)
    ratios = ([_strip_in(lanes)] if lanes else []) + [PANEL_IN] * panels
    axes = figure.subplots(len(ratios), 1, sharex=True, squeeze=False, gridspec_kw={"height_ratios": ratios})[:, 0]
    figure.subplots_adjust(left=LEFT, right=RIGHT, top=1 - (0.55 + NOTE_IN * notes) / height, bottom=0.6 / height,
                           hspace=0.12)
    return axes


def _frame(figure: Figure, first: dict, colours: dict, kinds: dict, unlabelled: int) -> None:
    """The title, the notes under it, and the legend right of the panels."""
    height = figure.get_figheight()
    figure.suptitle(first["title"], fontsize=13, y=1 - 0.12 / height, va="top")
    for line, note in enumerate(first.get("notes", [])):
        figure.text(LEFT, 1 - (0.5 + NOTE_IN * line) / height, note, fontsize=9, color="#555555", va="top")
    figure.legend(handles=_legend_handles(first["subruns"], colours, kinds, bool(first["skip_windows"]), unlabelled),
                  loc="center left", bbox_to_anchor=(RIGHT + 0.01, 0.5), fontsize=9, frameon=False)


def render_png(figures: Sequence[dict], path: Path) -> Path:
    """Write the figure as a PNG of :func:`png_size`; returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    build_figure(figures).savefig(path, format="png", dpi=DPI)
    return path


def _x_limits(figures: Sequence[dict]) -> tuple[float, float]:
    """The data's extent on the x axis, with a little room either side."""
    xs = [x for data in figures for segment in data["segments"] for x in segment["x"] if x is not None]
    xs += [mark["x"] for mark in figures[0]["incidents"] if mark["x"] is not None]
    xs += [w[key] for w in figures[0]["skip_windows"] for key in ("first_x", "last_x") if w[key] is not None]
    low, high = (min(xs), max(xs)) if xs else (0.0, 1.0)
    pad = max((high - low) * 0.01, 0.5 if figures[0]["x_axis"] == "step" else 0.0) or 0.5
    return low - pad, high + pad


def _x_ticks(ax: Axes, data: dict) -> None:
    ax.set_xlabel(data["x_label"])
    if data["x_axis"] == "step":
        ax.xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    elif data["x_axis"] == "tokens":
        ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: tokens_text(value)))


def tokens_text(count: float) -> str:
    """``1.2B``, ``350M``, ``12K``: a token count as papers write it."""
    for size, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(count) >= size:
            return f"{count / size:.3g}{suffix}"
    return f"{count:.0f}"


def incident_labels(incidents: Sequence[dict], limits: tuple[float, float]) -> list[IncidentLabel]:
    """One label per kind and cluster of incidents of that kind within :data:`CLUSTER_FRACTION`
    of the axis of its first, in order along the axis."""
    reach = CLUSTER_FRACTION * (limits[1] - limits[0])
    labels = []
    for kind in sorted({mark["kind"] for mark in incidents}):
        xs = sorted(mark["x"] for mark in incidents if mark["kind"] == kind and mark["x"] is not None)
        for x in xs:
            if labels and labels[-1].kind == kind and x - labels[-1].x <= reach:
                labels[-1].count += 1
            else:
                labels.append(IncidentLabel(x, kind, 1))
    return sorted(labels, key=lambda label: (label.x, label.kind))


def place_labels(labels: list[IncidentLabel], limits: tuple[float, float], width_px) -> list[IncidentLabel]:
    """Give each label, in order along the axis, the lowest lane where it clears every label
    there by :data:`LABEL_GAP_PX` (``width_px(text)``: its width with its box, in pixels):
    right of its line, else left of it (near the panels' right edge, or where the right is
    taken); None when no lane of :data:`MAX_LANES` has room either side."""
    axis_px = WIDTH_IN * DPI * (RIGHT - LEFT)
    offset = LABEL_OFFSET_PT * DPI / 72
    lanes: list[list[tuple[float, float]]] = [[] for _ in range(MAX_LANES)]
    for label in labels:
        at = (label.x - limits[0]) / (limits[1] - limits[0]) * axis_px
        width = width_px(label.text)
        sides = [(False, at + offset)] if at + offset + width <= axis_px else []
        sides += [(True, at - offset - width)] if at - offset - width >= 0 else []
        spot = next(((lane, left_of_line) for lane in range(MAX_LANES) for left_of_line, left in sides
                     if _clear(lanes[lane], left, left + width)), None)
        if spot is not None:
            label.lane, label.left_of_line = spot
            left = dict(sides)[label.left_of_line]
            lanes[label.lane].append((left, left + width))
    return labels


def _clear(taken: Sequence[tuple[float, float]], left: float, right: float) -> bool:
    return all(right + LABEL_GAP_PX <= start or end + LABEL_GAP_PX <= left for start, end in taken)


def _text_width_px(figure: Figure):
    """The width in pixels of a label's text and its box, as the Agg renderer draws it."""
    renderer = figure.canvas.get_renderer()
    font = FontProperties(size=LABEL_PT)
    pad = 2 * LABEL_PAD_PT * DPI / 72

    def width(text: str) -> float:
        return renderer.get_text_width_height_descent(text, font, ismath=False)[0] + pad

    return width


def _draw_strip(ax: Axes, incidents: Sequence[dict], labels: Sequence[IncidentLabel], lanes: int,
                kinds: dict) -> None:
    """The incidents' lines and their labels, lane 0 at the bottom (next to the curves)."""
    ax.set_label("incidents")
    ax.set_ylim(0, lanes)
    ax.set_yticks([])
    for side in ("top", "left", "right"):
        ax.spines[side].set_visible(False)
    ax.set_ylabel("incidents", fontsize=9, rotation=0, ha="right", va="center")
    for mark in incidents:
        if mark["x"] is not None:
            ax.axvline(mark["x"], color=kinds[mark["kind"]], linestyle="--", linewidth=0.9, zorder=2)
    for label in labels:
        if label.lane is None:
            continue
        ax.annotate(label.text, (label.x, label.lane + 0.5),
                    xytext=(-LABEL_OFFSET_PT if label.left_of_line else LABEL_OFFSET_PT, 0),
                    textcoords="offset points", ha="right" if label.left_of_line else "left", va="center",
                    fontsize=LABEL_PT, color=kinds[label.kind], zorder=5, gid="incident-label",
                    bbox={"boxstyle": f"square,pad={LABEL_PAD_PT / LABEL_PT}", "facecolor": "white",
                          "edgecolor": "none"})


def _draw_panel(ax: Axes, data: dict, colours: dict, kinds: dict) -> None:
    drawn = False
    for segment in data["segments"]:
        values = np.asarray([np.nan if v is None else v for v in segment["values"]], dtype=float)
        drawn |= bool(np.isfinite(values).any())
        ax.plot(segment["x"], values, color=colours[segment["subrun"]],
                alpha=1.0 if segment["kept"] else FADED_ALPHA,
                linewidth=KEPT_WIDTH if segment["kept"] else FADED_WIDTH, zorder=3 if segment["kept"] else 2)
    half_step = 0.5 if data["x_axis"] == "step" else 0.0
    for window in data["skip_windows"]:
        if window["first_x"] is None or window["last_x"] is None:
            continue
        # An edge line keeps a window of a few steps visible on a 150,000-step axis.
        ax.axvspan(window["first_x"] - half_step, window["last_x"] + half_step, facecolor=SKIP_COLOUR, alpha=0.2,
                   edgecolor=SKIP_COLOUR, linewidth=0.8, zorder=1)
    for mark in data["incidents"]:
        if mark["x"] is not None:  # beneath the curves: a spike at the incident's step stays in sight
            ax.axvline(mark["x"], color=kinds[mark["kind"]], linestyle="--", linewidth=0.9, alpha=0.8, zorder=1.5)
    if data["log_y"] and _has_positive(data):
        ax.set_yscale("log")
    ax.set_ylabel(data["axis_label"] + (" (log)" if ax.get_yscale() == "log" else ""), fontsize=9)
    ax.grid(True, alpha=0.3, linewidth=0.5)
    if not drawn:
        ax.text(0.5, 0.5, f"no {data['metric']} recorded", transform=ax.transAxes, ha="center", va="center",
                color="#555555")


def _has_positive(data: dict) -> bool:
    return any(v is not None and v > 0 for segment in data["segments"] for v in segment["values"])


def _legend_handles(subruns: Sequence[str], colours: dict, kinds: dict, skipped: bool, unlabelled: int) -> list:
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
    if unlabelled:  # their dashed lines are drawn; the colours above name their kinds
        handles.append(Line2D([], [], linestyle="none",
                              label=f"{unlabelled} incident{'s' if unlabelled > 1 else ''} too close to label"))
    return handles
