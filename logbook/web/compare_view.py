"""The page's run-vs-run overlay: ``/compare?runs=A,B`` reads both logbooks
read-only, judges B against A as ``runmgr logbook compare`` does
(logbook/compare_runs.py: the config diff and the verdict), and draws both
runs' kept curves on one axis per compared metric."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

from logbook import compare_runs as runs_compared
from logbook.compare_runs import COMPARED, RunComparison, RunSeries, compare_runs
from logbook.curves import curves
from logbook.errors import LogbookError
from logbook.plot import AXIS_LABELS
from logbook.plot_style import SUBRUN_COLOURS
from logbook.store import Logbook
from logbook.web.readonly import open_read_only

OVERLAY_POINTS = 2000
"""Points drawn per run and metric (each bucket's min and max kept, as the run page)."""
RUN_STYLES = ((SUBRUN_COLOURS[0], "solid", 3.0), (SUBRUN_COLOURS[3], "dashed", 1.6))
"""(colour, dash, width) of A and B: a wide blue line and a dashed red one over it, so two
runs that agree still show both."""


def parse_runs(text: Optional[str], known: set[str]) -> tuple[str, str]:
    """``A,B`` from the query string; a LogbookError says what is wrong and what to write."""
    names = [n.strip() for n in (text or "").split(",") if n.strip()]
    if len(names) != 2:
        raise LogbookError(f"name two runs to compare, e.g. /compare?runs=RUN_A,RUN_B (got {text or 'none'!r})")
    missing = [n for n in names if n not in known]
    if missing:
        raise LogbookError(f"no run {', '.join(map(repr, missing))} here: pick from {', '.join(sorted(known))}")
    if names[0] == names[1]:
        raise LogbookError(f"{names[0]!r} is named twice: compare two different runs")
    return names[0], names[1]


def run_series(book: Logbook, name: str) -> RunSeries:
    """What :func:`compare_runs` needs of one run, read through an already open (read-only) logbook."""
    return runs_compared.run_series(book, name, f"run {name!r}")


def kept_line(book: Logbook, metric: str) -> tuple[list[int], list[Optional[float]]]:
    """The kept lineage's curve of ``metric``, downsampled (logbook/curves.py)."""
    points = sorted((step, value) for segment in curves(book, metric, OVERLAY_POINTS) if segment.kept
                    for step, value in zip(segment.steps, segment.values))
    return [s for s, _ in points], [v if math.isfinite(v) else None for _, v in points]


def comparison(dirs: dict[str, Path], a: str, b: str) -> RunComparison:
    """B judged against A, as ``runmgr logbook compare A B`` judges it."""
    loaded = {}
    for name in (a, b):
        with open_read_only(dirs[name]) as book:
            loaded[name] = run_series(book, name)
    return compare_runs(loaded[a], loaded[b])


def overlay(dirs: dict[str, Path], a: str, b: str) -> list[dict]:
    """Both runs' kept curves of each compared metric: ``{"run", "metric", "steps", "values", "colour",
    "dash", "width"}``."""
    lines = []
    for name, (colour, dash, width) in zip((a, b), RUN_STYLES):
        with open_read_only(dirs[name]) as book:
            for metric in COMPARED:
                steps, values = kept_line(book, metric)
                lines.append({"run": name, "metric": metric, "steps": steps,
                              "values": [float("nan") if v is None else v for v in values], "colour": colour,
                              "dash": dash, "width": width})
    return lines


def labels() -> dict[str, str]:
    """Each compared metric's axis label."""
    return {metric: AXIS_LABELS[metric] for metric in COMPARED}
