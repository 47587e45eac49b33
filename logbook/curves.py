"""A metric's curve per sub-run, ready to draw: each sub-run's rows split into
the part the lineage kept and the part a later rollback threw away
(logbook.accounting), downsampled to about ``max_points`` points in all.

Downsampling keeps, in each bucket of ``width`` consecutive steps of one
segment, the row with the lowest and the row with the highest value, at
their own steps, so a spike of one step is never smoothed away. The buckets
are computed in SQL (two grouped scans of the metrics table), so a run of
150,000 steps answers in a fraction of a second.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

from logbook import queries
from logbook.accounting import needs_rows, split_metrics
from logbook.errors import LogbookError
from logbook.records import SubRun
from logbook.store import Logbook

METRICS = ("loss", "grad_norm", "lr", "loss_scale", "tokens_per_s", "step_time")
"""The metrics a curve can be drawn of."""

Point = tuple[int, float]


@dataclass(frozen=True)
class Segment:
    """A stretch of one sub-run's curve."""

    subrun: str
    kept: bool
    """False: steps a later rollback threw away (drawn faded)."""
    steps: tuple[int, ...]
    values: tuple[float, ...]
    """Downsampled (each bucket's min and max kept); NaN where the trainer recorded NaN."""


def keep_limits(subruns: Sequence[SubRun]) -> dict[str, Optional[int]]:
    """Sub-run id -> the lowest start step of the sub-runs after it (None for the last):
    its rows above that step were thrown away (exact unless
    :func:`logbook.accounting.needs_rows`)."""
    limits: dict[str, Optional[int]] = {}
    lowest: Optional[int] = None
    for subrun in reversed(subruns):
        limits[subrun.id] = lowest
        lowest = subrun.start_step if lowest is None else min(lowest, subrun.start_step)
    return limits


def curves(book: Logbook, metric: str, max_points: int = 4000) -> list[Segment]:
    """The segments of ``metric`` in lineage order (kept part of a sub-run first)."""
    if metric not in METRICS:
        raise LogbookError(f"unknown metric {metric!r}: pick one of {', '.join(METRICS)}")
    if max_points < 2:
        raise LogbookError(f"max_points must be at least 2 (a bucket's min and max), got {max_points}")
    with book.snapshot():
        lineage = book.lineage()
        stats = book.query(queries.step_stats)
        if needs_rows(lineage, stats):
            return _from_rows(lineage, book.all_metrics(), metric, max_points)
        rows = sum(s.rows for s in stats.values())
        width = max(1, math.ceil(rows * 2 / max_points))
        buckets = book.query(queries.metric_buckets, metric, width)
        limits = keep_limits(lineage)
        segments = []
        for subrun in lineage:
            points = buckets.get(subrun.id, {})
            limit = limits[subrun.id]
            first = None if limit is None else limit // width * width
            if limit is not None and width > 1 and (limit + 1) % width and first in points:
                # The bucket holding the limit mixes kept and thrown-away rows: split it exactly.
                rows_there = book.query(queries.metric_points, metric, subrun.id, first, first + width - 1)
                del points[first]
                for side in ([p for p in rows_there if p[0] <= limit], [p for p in rows_there if p[0] > limit]):
                    if side:
                        points[side[0][0]] = _envelope(side)
            ordered = [point for key in sorted(points) for point in points[key]]
            segments += _segments(subrun.id, [p for p in ordered if limit is None or p[0] <= limit],
                                  [p for p in ordered if limit is not None and p[0] > limit])
        return segments


def _count_up_to(rows: Sequence[Point], limit: int) -> int:
    return sum(1 for step, _ in rows if step <= limit)


def _envelope(points: Sequence[Point]) -> list[Point]:
    """The lowest and the highest point (NaN counts as highest: it is a fault to see), in step order."""
    finite = [p for p in points if not math.isnan(p[1])]
    nan = [p for p in points if math.isnan(p[1])]
    chosen = {min(finite, key=lambda p: p[1]), max(finite, key=lambda p: p[1])} if finite else set()
    if nan:
        chosen.add(nan[0])
    return sorted(chosen)


def _segments(subrun_id: str, kept: list[Point], lost: list[Point]) -> list[Segment]:
    out = []
    for flag, points in ((True, kept), (False, lost)):
        if points:
            out.append(Segment(subrun_id, flag, tuple(p[0] for p in points), tuple(p[1] for p in points)))
    return out


def _from_rows(lineage: Sequence[SubRun], rows: Iterable[dict], metric: str, max_points: int) -> list[Segment]:
    """The exact route for lineages whose sub-runs re-recorded steps at or below their own start."""
    rows = list(rows)
    _, superseded = split_metrics(lineage, rows)
    thrown = {id(row) for row in superseded}
    width = max(1, math.ceil(len(rows) * 2 / max_points))
    segments = []
    for subrun in lineage:
        own = sorted((r for r in rows if r["subrun"] == subrun.id), key=lambda r: r["step"])
        runs: list[tuple[bool, list[Point]]] = []
        for row in own:
            if row[metric] is None:
                continue
            kept = id(row) not in thrown
            if not runs or runs[-1][0] != kept:
                runs.append((kept, []))
            runs[-1][1].append((row["step"], row[metric]))
        for kept, points in runs:
            sampled = [p for start in range(0, len(points), width) for p in _envelope(points[start:start + width])]
            segments.append(Segment(subrun.id, kept, tuple(p[0] for p in sampled), tuple(p[1] for p in sampled)))
    return segments
