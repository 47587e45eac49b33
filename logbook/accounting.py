"""What a lineage kept and what it lost: pure functions over sub-runs and
metrics rows, so they are tested without a database.

Steps. A sub-run that starts from step S supersedes every step above S that
earlier sub-runs trained: those steps were lost and are trained again. The
*kept* metrics are what survives, walking the sub-runs in order. A sub-run's
``lost steps`` are how far its predecessor got past S; summed over the
lineage they equal steps trained minus steps kept.

Time. ETTR (effective training time ratio) = kept time / wall time, where
  kept time = sum of ``step_time`` over the kept metrics rows (the seconds
              rank 0 spent on each step that survived; checkpoint saves,
              restarts, health checks and redone steps are not in it), and
  wall time = from the first sub-run's start to the last sub-run's end, or,
              while it has no end, to the last thing the logbook recorded
              (so a run whose driver died does not lose ETTR every day after).
Both are read from the logbook's clock and the trainer's step timings, never
from the time the figures are looked at.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional, Sequence

from logbook.records import SubRun


@dataclass(frozen=True)
class SubRunCost:
    """What starting one sub-run cost the lineage."""

    lost_steps: int
    """Steps the previous sub-run trained past this one's start step."""
    lost_step_time: float
    """Seconds of training spent on those steps (their ``step_time``)."""
    downtime: float
    """Seconds from the previous sub-run's end (or last record) to this start."""


def furthest_step(subrun: SubRun, max_metric_step: Optional[int]) -> int:
    """How far a sub-run got: its recorded last step or its metrics, whichever
    is further; its start step when it trained nothing."""
    candidates = [subrun.start_step]
    if subrun.last_step is not None:
        candidates.append(subrun.last_step)
    if max_metric_step is not None:
        candidates.append(max_metric_step)
    return max(candidates)


def lost_steps(previous_furthest: int, start_step: int) -> int:
    """Steps trained by the predecessor that a start at ``start_step`` discards."""
    return max(0, previous_furthest - start_step)


def split_metrics(subruns: Sequence[SubRun], rows: Iterable[dict]) -> tuple[list[dict], list[dict]]:
    """(kept, superseded) metrics rows; kept sorted by step.

    ``rows`` carry a ``subrun`` key; sub-runs are taken in lineage order.
    """
    kept, superseded_by = _walk(subruns, rows)
    return kept, [row for lost in superseded_by.values() for row in lost]


def _walk(subruns: Sequence[SubRun], rows: Iterable[dict]) -> tuple[list[dict], dict[str, list[dict]]]:
    """Kept rows, and for each sub-run the earlier rows its start superseded."""
    by_subrun: dict[str, list[dict]] = {}
    for row in rows:
        by_subrun.setdefault(row["subrun"], []).append(row)
    kept: dict[int, dict] = {}
    superseded_by: dict[str, list[dict]] = {}
    for subrun in subruns:
        lost = superseded_by.setdefault(subrun.id, [])
        for step in [s for s in kept if s > subrun.start_step]:
            lost.append(kept.pop(step))
        for row in sorted(by_subrun.get(subrun.id, ()), key=lambda r: r["step"]):
            if row["step"] in kept:  # a step at or below its own start: the later row holds
                lost.append(kept[row["step"]])
            kept[row["step"]] = row
    return [kept[step] for step in sorted(kept)], superseded_by


def subrun_costs(
    subruns: Sequence[SubRun], rows: Sequence[dict], last_activity: Mapping[str, float]
) -> dict[str, SubRunCost]:
    """The cost of starting each sub-run; the first one costs nothing.

    ``last_activity`` maps a sub-run id to the time of its last record; it
    stands in for the end of a sub-run that has none.
    """
    step_max: dict[str, int] = {}
    for row in rows:
        step_max[row["subrun"]] = max(step_max.get(row["subrun"], row["step"]), row["step"])
    _, superseded_by = _walk(subruns, rows)
    costs: dict[str, SubRunCost] = {}
    for previous, subrun in zip([None, *subruns[:-1]], subruns):
        if previous is None:
            costs[subrun.id] = SubRunCost(0, 0.0, 0.0)
            continue
        previous_end = previous.ended_at
        if previous_end is None:
            previous_end = last_activity.get(previous.id, previous.started_at)
        costs[subrun.id] = SubRunCost(
            lost_steps=lost_steps(furthest_step(previous, step_max.get(previous.id)), subrun.start_step),
            lost_step_time=sum(row.get("step_time") or 0.0 for row in superseded_by[subrun.id]),
            downtime=max(0.0, subrun.started_at - previous_end),
        )
    return costs


def run_summary(
    subruns: Sequence[SubRun],
    rows: Sequence[dict],
    incident_kinds: Iterable[str],
    checkpoint_count: int,
    last_record_time: Optional[float],
) -> dict:
    """Run-level figures; see the module docstring for ETTR."""
    kept, _ = split_metrics(subruns, rows)
    costs = subrun_costs(subruns, rows, last_activity={})
    kept_time = sum(row.get("step_time") or 0.0 for row in kept)
    started_at = subruns[0].started_at if subruns else None
    ended_at = _run_end(subruns, last_record_time)
    wall_time = (ended_at - started_at) if started_at is not None and ended_at is not None else 0.0
    last = subruns[-1] if subruns else None
    return {
        "run": last.id.split(".")[0] if last else None,
        "subruns": len(subruns),
        "last_subrun": last.id if last else None,
        "last_state": last.end_state if last else None,
        "last_step": kept[-1]["step"] if kept else (last.start_step if last else 0),
        "incidents": dict(Counter(incident_kinds)),
        "checkpoints": checkpoint_count,
        "steps_kept": len(kept),
        "steps_lost": sum(cost.lost_steps for cost in costs.values()),
        "started_at": started_at,
        "ended_at": ended_at,
        "wall_time_s": wall_time,
        "kept_time_s": kept_time,
        "lost_time_s": max(0.0, wall_time - kept_time),
        "ettr": (kept_time / wall_time) if wall_time > 0 else None,
    }


def _run_end(subruns: Sequence[SubRun], last_record_time: Optional[float]) -> Optional[float]:
    if not subruns:
        return None
    last = subruns[-1]
    if last.ended_at is not None:
        return last.ended_at
    return last_record_time if last_record_time is not None else last.started_at
