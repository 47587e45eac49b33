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
              (so a run whose driver died does not lose ETTR every day after),
              less the spans it stood stopped by a person (``paused`` below).
Both are read from the logbook's clock and the trainer's step timings, never
from the time the figures are looked at.

What each restart cost (sub-run k >= 1, against sub-run k-1), all in seconds:
  redone   = sum of ``step_time`` over the rows k's start superseded (steps
             trained and thrown away, trained again after it);
  downtime = k's start - (k-1)'s end (its last record when it has no end);
  paused   = the same span where (k-1) ended ``stopped`` (a person stopped it: Ctrl-C,
             SIGTERM): the run stood still on purpose until it was relaunched, so the
             span is neither downtime nor wall time (ETTR does not count it as lost);
  restart  = from k's start to the moment its first step began: the row of
             its lowest step, its ``time`` (else ``recorded_at``) minus its
             ``step_time``; a sub-run that trained nothing restarted for its
             whole life (start to end, or to its last record).
ETTR over time: at each sub-run's end, kept time of the lineage up to that
sub-run (as it stood then) / (that end - the first sub-run's start).
Per incident class and MTBI: see logbook.incident_costs.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Optional, Sequence

from logbook.records import SubRun

STOPPED = "stopped"
"""The end state of a sub-run a person stopped (logbook.records.SubRun.end_state)."""


@dataclass(frozen=True)
class SubRunCost:
    """What starting one sub-run cost the lineage."""

    lost_steps: int
    """Steps the previous sub-run trained past this one's start step."""
    lost_step_time: float
    """Seconds of training spent on those steps (their ``step_time``)."""
    downtime: float
    """Seconds from the previous sub-run's end (or last record) to this start."""
    restart: float = 0.0
    """Seconds from this start to the moment its first step began (see the module docstring)."""
    paused: float = 0.0
    """Seconds the run stood stopped by a person before this start (then ``downtime`` is 0)."""


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
        downtime, paused = _downtime_and_pause(previous, subrun, last_activity)
        costs[subrun.id] = SubRunCost(
            lost_steps=lost_steps(furthest_step(previous, step_max.get(previous.id)), subrun.start_step),
            lost_step_time=sum(row.get("step_time") or 0.0 for row in superseded_by[subrun.id]),
            downtime=downtime, paused=paused,
        )
    return costs


def run_summary(
    subruns: Sequence[SubRun],
    rows: Sequence[dict],
    incident_kinds: Iterable[str],
    checkpoint_count: int,
    last_record_time: Optional[float],
) -> dict:
    """Run-level figures from metrics rows; see the module docstring for ETTR."""
    books = ledger(subruns, step_stats(rows), superseded_from_rows(subruns, rows), last_activity={})
    return summary_of(subruns, books, incident_kinds, checkpoint_count, last_record_time)


def summary_of(
    subruns: Sequence[SubRun],
    books: "Ledger",
    incident_kinds: Iterable[str],
    checkpoint_count: int,
    last_record_time: Optional[float],
) -> dict:
    """Run-level figures from the lineage's :class:`Ledger`."""
    started_at = subruns[0].started_at if subruns else None
    ended_at = _run_end(subruns, last_record_time)
    wall_time = (ended_at - started_at - books.paused) if started_at is not None and ended_at is not None else 0.0
    last = subruns[-1] if subruns else None
    last_step = books.last_kept_step if books.last_kept_step is not None else (last.start_step if last else 0)
    return {
        "run": last.id.split(".")[0] if last else None,
        "subruns": len(subruns),
        "last_subrun": last.id if last else None,
        "last_state": last.end_state if last else None,
        "last_step": last_step,
        "incidents": dict(Counter(incident_kinds)),
        "checkpoints": checkpoint_count,
        "steps_kept": books.steps_kept,
        "steps_lost": sum(cost.lost_steps for cost in books.costs.values()),
        "started_at": started_at,
        "ended_at": ended_at,
        "wall_time_s": wall_time,
        "paused_s": books.paused,
        "kept_time_s": books.kept_time,
        "lost_time_s": max(0.0, wall_time - books.kept_time),
        "ettr": (books.kept_time / wall_time) if wall_time > 0 else None,
    }


def _run_end(subruns: Sequence[SubRun], last_record_time: Optional[float]) -> Optional[float]:
    if not subruns:
        return None
    last = subruns[-1]
    if last.ended_at is not None:
        return last.ended_at
    return last_record_time if last_record_time is not None else last.started_at


# ---- the ledger: kept and lost per sub-run, fast on many rows ------------


@dataclass(frozen=True)
class StepStats:
    """One sub-run's metrics rows reduced to what the ledger needs (an SQL aggregate)."""

    rows: int
    first_step: int
    last_step: int
    step_time: float
    """Sum of ``step_time`` over its rows."""
    first_began: Optional[float]
    """When its lowest step began: that row's ``time`` (else ``recorded_at``) minus its ``step_time``."""


@dataclass(frozen=True)
class RangeTotals:
    """Rows of one sub-run within a range of steps."""

    rows: int
    step_time: float
    last_step: Optional[int]


RangeReader = Callable[[str, Optional[int], Optional[int]], RangeTotals]
"""(sub-run id, above, up_to) -> its rows with above < step <= up_to (None: no limit)."""


@dataclass(frozen=True)
class Superseded:
    """What each sub-run's start threw away, and what survived the whole lineage."""

    by_start: dict[str, RangeTotals]
    """Sub-run id -> the earlier rows its start superseded (rows, their step_time)."""
    last_kept_step: Optional[int]


@dataclass(frozen=True)
class Ledger:
    """The lineage's books, per sub-run and in all (definitions in the module docstring)."""

    costs: dict[str, SubRunCost]
    steps_kept: int
    kept_time: float
    last_kept_step: Optional[int]
    ettr_series: tuple[tuple[float, float], ...]
    """(a sub-run's end, ETTR up to then), one point per ended sub-run."""
    reached: dict[str, int]
    """Sub-run id -> how far it got (:func:`furthest_step`)."""
    paused: float = 0.0
    """Seconds the lineage stood stopped by a person between sub-runs (not wall time)."""


def step_stats(rows: Iterable[dict]) -> dict[str, StepStats]:
    """:class:`StepStats` per sub-run from metrics rows (the store computes them in SQL)."""
    grouped: dict[str, list[dict]] = {}
    for row in rows:
        grouped.setdefault(row["subrun"], []).append(row)
    stats = {}
    for subrun_id, own in grouped.items():
        first = min(own, key=lambda r: r["step"])
        stats[subrun_id] = StepStats(len(own), first["step"], max(r["step"] for r in own),
                                     sum(_seconds(r.get("step_time")) for r in own), first_began(first))
    return stats


def first_began(row: Mapping) -> Optional[float]:
    """When a metrics row's step began (see :class:`StepStats`)."""
    at = row.get("time") if row.get("time") is not None else row.get("recorded_at")
    return None if at is None else at - _seconds(row.get("step_time"))


def superseded_from_rows(subruns: Sequence[SubRun], rows: Iterable[dict]) -> Superseded:
    """Exact for any rows (also rows at or below their own sub-run's start step)."""
    kept, superseded_by = _walk(subruns, rows)
    by_start = {sid: RangeTotals(len(lost), sum(_seconds(r.get("step_time")) for r in lost),
                                 max((r["step"] for r in lost), default=None))
                for sid, lost in superseded_by.items()}
    return Superseded(by_start, kept[-1]["step"] if kept else None)


def needs_rows(subruns: Sequence[SubRun], stats: Mapping[str, StepStats]) -> bool:
    """True when a later sub-run recorded a step at or below its own start: only the
    row walk (:func:`superseded_from_rows`) tells which row of that step holds."""
    return any(sub.id in stats and stats[sub.id].first_step <= sub.start_step for sub in subruns[1:])


def superseded_from_ranges(subruns: Sequence[SubRun], stats: Mapping[str, StepStats],
                           read_range: RangeReader) -> Superseded:
    """The same as :func:`superseded_from_rows` from per-sub-run aggregates and a few
    range reads, when :func:`needs_rows` is False: a row is then kept exactly while
    its step is at most every later start, so a start at S throws away each earlier
    sub-run's rows above S, up to the lowest start between them."""
    up_to: dict[str, Optional[int]] = {sub.id: None for sub in subruns}
    by_start = {}
    for position, subrun in enumerate(subruns):
        rows, seconds, last = 0, 0.0, None
        for earlier in subruns[:position]:
            limit, own = up_to[earlier.id], stats.get(earlier.id)
            if own is not None and own.last_step > subrun.start_step and (limit is None or limit > subrun.start_step):
                lost = read_range(earlier.id, subrun.start_step, limit)
                rows, seconds = rows + lost.rows, seconds + lost.step_time
                last = max((s for s in (last, lost.last_step) if s is not None), default=None)
            up_to[earlier.id] = subrun.start_step if limit is None else min(limit, subrun.start_step)
        by_start[subrun.id] = RangeTotals(rows, seconds, last)
    kept_tops = []
    for subrun in subruns:
        own, limit = stats.get(subrun.id), up_to[subrun.id]
        if own is None:
            continue
        kept_tops.append(own.last_step if limit is None or own.last_step <= limit
                         else read_range(subrun.id, None, limit).last_step)
    return Superseded(by_start, max((s for s in kept_tops if s is not None), default=None))


def ledger(subruns: Sequence[SubRun], stats: Mapping[str, StepStats], superseded: Superseded,
           last_activity: Mapping[str, float]) -> Ledger:
    """Walk the lineage once: each start's cost, what is kept, ETTR at each end."""
    costs: dict[str, SubRunCost] = {}
    reached = {sub.id: furthest_step(sub, stats[sub.id].last_step if sub.id in stats else None) for sub in subruns}
    kept_rows, kept_time, paused, series = 0, 0.0, 0.0, []
    for previous, subrun in zip([None, *subruns[:-1]], subruns):
        own, lost = stats.get(subrun.id), superseded.by_start.get(subrun.id, RangeTotals(0, 0.0, None))
        restart = _restart(subrun, own, last_activity)
        if previous is None:
            costs[subrun.id] = SubRunCost(0, 0.0, 0.0, restart)
        else:
            downtime, pause = _downtime_and_pause(previous, subrun, last_activity)
            paused += pause
            costs[subrun.id] = SubRunCost(lost_steps(reached[previous.id], subrun.start_step), lost.step_time,
                                          downtime, restart, pause)
        kept_rows += (own.rows if own else 0) - lost.rows
        kept_time += (own.step_time if own else 0.0) - lost.step_time
        elapsed = None if subrun.ended_at is None else subrun.ended_at - subruns[0].started_at - paused
        if elapsed is not None and elapsed > 0:
            series.append((subrun.ended_at, kept_time / elapsed))
    return Ledger(costs, kept_rows, kept_time, superseded.last_kept_step, tuple(series), reached, paused)


def _restart(subrun: SubRun, own: Optional[StepStats], last_activity: Mapping[str, float]) -> float:
    if own is None or own.first_began is None:
        return max(0.0, _end(subrun, last_activity) - subrun.started_at)
    return max(0.0, own.first_began - subrun.started_at)


def _downtime_and_pause(previous: SubRun, subrun: SubRun, last_activity: Mapping[str, float]) -> tuple[float, float]:
    """The span from ``previous``'s end to ``subrun``'s start, as (downtime, paused): paused when a
    person stopped ``previous`` (the wait for the relaunch is not lost), else downtime."""
    gap = max(0.0, subrun.started_at - _end(previous, last_activity))
    return (0.0, gap) if previous.end_state == STOPPED else (gap, 0.0)


def _end(subrun: SubRun, last_activity: Mapping[str, float]) -> float:
    if subrun.ended_at is not None:
        return subrun.ended_at
    return last_activity.get(subrun.id, subrun.started_at)


def _seconds(value: Optional[float]) -> float:
    # A step with no timing (or NaN: a broken clock) adds nothing to kept or redone time.
    return 0.0 if value is None or value != value else float(value)
