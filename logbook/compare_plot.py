"""The picture of ``runmgr logbook compare --plot FILE``: per metric, the
difference ``B - A`` against the step, the baseline pair's band ``±band``
shaded around zero, the steps outside it marked, and the verdict's step as a
dashed line. ``FILE.png`` is drawn with matplotlib's object API on the Agg
canvas (as logbook/plot_png.py draws), ``FILE.html`` with bokeh, its
JavaScript inside (works offline, as logbook/plot_html.py)."""

from __future__ import annotations

import math
from pathlib import Path

from logbook.compare import MetricComparison
from logbook.compare_runs import RunComparison
from logbook.errors import LogbookError

PLOT_SUFFIXES = (".png", ".html")
DIFF_COLOUR = "#1f77b4"
BAND_COLOUR = "#7f7f7f"
OUT_COLOUR = "#d62728"
FAR = 50
"""A difference this many times the band's width switches the PNG's y axis to symlog."""
DPI = 100
WIDTH_IN, PANEL_IN, MARGIN_IN = 12.0, 2.8, 1.1


def check_plot_path(path: Path) -> None:
    """Refuse, before anything is read, a file the plot could not be written as."""
    if path.suffix.lower() not in PLOT_SUFFIXES:
        raise LogbookError(f"--plot {path} must end in .png or .html: name the file e.g. {path.with_suffix('.png').name}")
    if path.is_dir():
        raise LogbookError(f"--plot {path} is a directory: name a file ending in .png or .html")


def write_plot(result: RunComparison, path: Path) -> Path:
    """Draw ``result`` into ``path`` (PNG or HTML by its suffix); returns ``path``."""
    check_plot_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == ".png":
        _png(result, path)
    else:
        _html(result, path)
    return path


def title(result: RunComparison) -> str:
    against = f" (band: {result.baseline[0]} vs {result.baseline[1]})" if result.baseline else ""
    return f"{result.b} − {result.a}{against}: {result.verdict.text()}"


def _finite(values) -> list[float]:
    return [v if math.isfinite(v) else math.nan for v in values]


def _png(result: RunComparison, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(WIDTH_IN, PANEL_IN * len(result.metrics) + MARGIN_IN), dpi=DPI)
    FigureCanvasAgg(figure)
    axes = figure.subplots(len(result.metrics), 1, sharex=True, squeeze=False)[:, 0]
    for ax, metric in zip(axes, result.metrics):
        _png_panel(ax, metric)
    axes[-1].set_xlabel("step")
    axes[0].legend(loc="upper left", fontsize=8, frameon=False)
    figure.suptitle(title(result), fontsize=12)
    figure.savefig(path, format="png", dpi=DPI)


def _png_panel(ax, metric: MetricComparison) -> None:
    steps = list(metric.steps)
    if metric.band is not None:
        ax.fill_between(steps, [-w for w in metric.band], list(metric.band), step="mid", color=BAND_COLOUR,
                        alpha=0.3, label="baseline band ±|D−C| (running max)")
    ax.axhline(0.0, color="#444444", linewidth=0.6)
    ax.plot(steps, _finite(metric.diff), color=DIFF_COLOUR, linewidth=1.3, marker=".", markersize=3, label="B − A")
    out = [(s, d) for s, d, o in zip(steps, metric.diff, metric.outside()) if o and math.isfinite(d)]
    if out:
        ax.scatter([s for s, _ in out], [d for _, d in out], color=OUT_COLOUR, s=12, zorder=4,
                   label="outside the band")
    if metric.verdict.step is not None:
        ax.axvline(metric.verdict.step, color=OUT_COLOUR, linestyle="--", linewidth=0.9)
    _symlog_when_far(ax, metric)
    ax.set_ylabel(f"{metric.metric} B − A" + (" (symlog)" if ax.get_yscale() == "symlog" else ""), fontsize=9)
    ax.set_title(f"{metric.metric}: {metric.verdict.text()}", fontsize=9, loc="left")
    ax.grid(True, alpha=0.3, linewidth=0.5)


def _symlog_when_far(ax, metric: MetricComparison) -> None:
    """A difference :data:`FAR` times wider than the band would flatten the band to a line:
    the y axis is then symlog, linear inside the band and logarithmic beyond it."""
    widest = max(metric.band) if metric.band else 0.0
    largest = max((abs(d) for d in metric.diff if math.isfinite(d)), default=0.0)
    if widest > 0 and largest > FAR * widest:
        ax.set_yscale("symlog", linthresh=widest, linscale=2.0)
        # Ticks at 0 and at the decades beyond the band, where the data reach: ticks inside the
        # linear part would pile their labels onto 0's.
        finite = [d for d in metric.diff if math.isfinite(d)]
        decades = [10.0 ** k for k in range(math.ceil(math.log10(widest)), math.floor(math.log10(largest)) + 1)]
        ax.set_yticks(sorted([0.0] + [t for t in decades if t <= max(finite)] + [-t for t in decades if -t >= min(finite)]))


def _html(result: RunComparison, path: Path) -> None:
    from bokeh.embed import file_html
    from bokeh.layouts import column
    from bokeh.models import PlainText, Span, Title
    from bokeh.plotting import figure
    from bokeh.resources import INLINE

    panels = []
    for metric in result.metrics:
        shared = {"x_range": panels[0].x_range} if panels else {}
        panel = figure(width=1100, height=280, tools="xpan,xwheel_zoom,box_zoom,reset,save", **shared)
        panel.title = Title(text=PlainText(text=f"{metric.metric}: {metric.verdict.text()}"))
        steps = list(metric.steps)
        if metric.band is not None:
            panel.varea(x=steps, y1=[-w for w in metric.band], y2=list(metric.band), fill_color=BAND_COLOUR,
                        fill_alpha=0.3, legend_label="baseline band")
        panel.line(steps, _finite(metric.diff), line_color=DIFF_COLOUR, line_width=1.5, legend_label="B − A")
        if metric.verdict.step is not None:
            panel.add_layout(Span(location=metric.verdict.step, dimension="height", line_color=OUT_COLOUR,
                                  line_dash="dashed"))
        panel.yaxis.axis_label = f"{metric.metric} B − A"
        panels.append(panel)
    panels[-1].xaxis.axis_label = "step"
    path.write_text(file_html(column(*panels), INLINE, title=title(result)), encoding="utf-8")
