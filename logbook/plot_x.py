"""Where each recorded step sits on the x axis of ``runmgr logbook plot --x``:
the step itself, the tokens trained up to it, or the wall-clock time since the
run began.

Tokens are counted along each step's own history: a sub-run that resumed at
step ``s`` starts from the tokens the lineage had trained by ``s`` (the newest
earlier sub-run that recorded ``s``), then adds its own steps' tokens. So a
rollback's replayed steps sit at the same tokens as the steps they replace,
and a batch-size change bends the axis as it bent the run.

Wall-clock time is each step's own time (the trainer's, else when the driver
recorded it) since the first sub-run started: the downtime between sub-runs
shows as gaps, and a rollback's thrown-away steps sit where they happened.
"""

from __future__ import annotations

import sqlite3
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Optional, Sequence

from logbook.errors import LogbookError
from logbook.records import SubRun
from logbook.store import Logbook

X_AXES = ("step", "tokens", "wall")
"""What ``--x`` may name; ``step`` is the default."""
WALL_UNITS = ((120.0, 1.0, "s"), (120.0 * 60, 60.0, "min"), (float("inf"), 3600.0, "h"))
"""(span below, seconds per unit, unit): a run is drawn in the largest unit that keeps it above 2 units."""


@dataclass(frozen=True)
class XAxis:
    """Each sub-run's recorded steps and their positions on the chosen axis."""

    name: str
    label: str
    positions: dict[str, tuple[list[int], list[float]]] = field(default_factory=dict)
    """Sub-run -> (its recorded steps ascending, their x); empty for the step axis."""

    def at(self, subrun: str, step: int) -> Optional[float]:
        """``step`` of ``subrun`` on this axis: its own row's position, else the nearest
        recorded step below it (an incident after the last step), else the first above;
        None when the sub-run recorded no step."""
        if self.name == "step":
            return float(step)
        steps, xs = self.positions.get(subrun, ([], []))
        if not steps:
            return None
        index = bisect_right(steps, step) - 1
        return xs[max(index, 0)]


def parse_x(text: str) -> str:
    """``--x`` as an axis name, refused with one line when unknown."""
    if text not in X_AXES:
        raise LogbookError(f"--x {text!r} is not an x axis: choose step, tokens or wall")
    return text


def x_axis(book: Logbook, lineage: Sequence[SubRun], name: str) -> XAxis:
    """The positions of every recorded step on axis ``name`` (one read of the metrics table)."""
    parse_x(name)
    if name == "step":
        return XAxis("step", "step")
    rows = book.query(_step_rows)
    if name == "tokens":
        return XAxis("tokens", "tokens trained", _token_positions(lineage, rows))
    return _wall_axis(lineage, rows)


def _step_rows(connection: sqlite3.Connection) -> list[tuple[str, int, Optional[int], float]]:
    """(sub-run, step, tokens, time) of every metrics row, by sub-run index then step;
    the time is the trainer's when it reported one, else when the driver recorded the row."""
    query = ("SELECT m.subrun_id, m.step, m.tokens, COALESCE(m.time, m.recorded_at) FROM metrics m "
             "JOIN subrun_starts s ON s.subrun_id = m.subrun_id ORDER BY s.idx, m.step")
    return connection.execute(query).fetchall()


def _by_subrun(rows: Sequence[tuple]) -> dict[str, list[tuple]]:
    grouped: dict[str, list[tuple]] = {}
    for row in rows:
        grouped.setdefault(row[0], []).append(row)
    return grouped


def _token_positions(lineage: Sequence[SubRun], rows: Sequence[tuple]) -> dict[str, tuple[list[int], list[float]]]:
    if not any(row[2] for row in rows):
        raise LogbookError("--x tokens: this logbook records no tokens per step (the trainer reported none): "
                           "use --x step or --x wall")
    grouped, positions = _by_subrun(rows), {}
    for subrun in lineage:
        own = grouped.get(subrun.id, [])
        if not own:
            continue
        total = _tokens_at(positions, subrun.start_step, own)
        per_step = next(row[2] for row in own if row[2]) if any(row[2] for row in own) else 0
        steps, xs = [], []
        for _, step, tokens, _ in own:
            per_step = tokens or per_step  # a row without its count trained as many as the one before
            total += per_step
            steps.append(step)
            xs.append(float(total))
        positions[subrun.id] = (steps, xs)
    return positions


def _tokens_at(positions: dict[str, tuple[list[int], list[float]]], step: int, own: Sequence[tuple]) -> float:
    """Tokens trained by ``step``, as the newest earlier sub-run that recorded it counted them;
    with none (a resume from another run's checkpoint), ``step`` steps of this sub-run's first size."""
    if step <= 0:
        return 0.0
    for steps, xs in reversed(list(positions.values())):
        index = bisect_right(steps, step) - 1
        if index >= 0 and steps[index] == step:
            return xs[index]
    first = next((row[2] for row in own if row[2]), 0)
    return float(step * first)


def _wall_axis(lineage: Sequence[SubRun], rows: Sequence[tuple]) -> XAxis:
    origin = min([subrun.started_at for subrun in lineage] + [row[3] for row in rows])
    span = max((row[3] for row in rows), default=origin) - origin
    per_unit, unit = next((size, unit) for below, size, unit in WALL_UNITS if span < below)
    positions = {subrun: ([row[1] for row in own], [(row[3] - origin) / per_unit for row in own])
                 for subrun, own in _by_subrun(rows).items()}
    return XAxis("wall", f"wall-clock time since the launch ({unit})", positions)
