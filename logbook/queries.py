"""Reading a logbook file: plain functions from a connection to records.

Everything comes back in the order it was written (journal sequence, or
sub-run index then step for metrics), which for the single writer is the
order in which it happened.
"""

from __future__ import annotations

import sqlite3
from typing import Optional, Sequence

from logbook.accounting import RangeTotals, StepStats, first_began
from logbook.records import METRIC_FIELDS, METRIC_FLOATS, SubRun, decode_float, from_json

_SUBRUNS = """
SELECT s.subrun_id, s.idx, js.time, s.cause, s.evidence, s.start_checkpoint, s.start_step,
       s.plan, s.config, s.config_diff, je.time, e.end_state, e.last_step, e.reason
FROM subrun_starts s JOIN journal js ON js.seq = s.seq
LEFT JOIN subrun_ends e ON e.subrun_id = s.subrun_id
LEFT JOIN journal je ON je.seq = e.seq
ORDER BY s.idx"""


def fetch_subruns(connection: sqlite3.Connection) -> list[SubRun]:
    """The lineage, first sub-run first."""
    return [
        SubRun(
            id=sid, index=idx, started_at=started, cause=cause, evidence=from_json(evidence),
            start_checkpoint=checkpoint, start_step=start_step, plan=from_json(plan),
            config=from_json(config), config_diff=from_json(diff), ended_at=ended,
            end_state=state, last_step=last_step, end_reason=reason,
        )
        for (sid, idx, started, cause, evidence, checkpoint, start_step, plan, config, diff,
             ended, state, last_step, reason) in connection.execute(_SUBRUNS)
    ]


def fetch_metrics(connection: sqlite3.Connection, subrun_id: Optional[str] = None,
                  steps: Optional[Sequence[int]] = None) -> list[dict]:
    """Metrics rows (each with its ``subrun``), by sub-run index then step; with
    ``steps`` (and a ``subrun_id``), only those steps' rows."""
    columns = ", ".join(f"m.{name}" for name in METRIC_FIELDS)
    query = (
        f"SELECT m.subrun_id, {columns} FROM metrics m "
        "JOIN subrun_starts s ON s.subrun_id = m.subrun_id"
    )
    params: tuple = ()
    if subrun_id is not None:
        query += " WHERE m.subrun_id = ?"
        params = (subrun_id,)
    if steps is not None:
        query += f" AND m.step IN ({', '.join('?' for _ in steps)})"
        params = (*params, *steps)
    rows = []
    for values in connection.execute(query + " ORDER BY s.idx, m.step", params):
        row = {"subrun": values[0], **dict(zip(METRIC_FIELDS, values[1:]))}
        for name in METRIC_FLOATS:
            row[name] = decode_float(row[name])
        row["skipped"] = bool(row["skipped"])
        rows.append(row)
    return rows


def stream_positions(connection: sqlite3.Connection) -> list[dict]:
    """``{"subrun", "step", "consumed_samples"}`` of every metrics row, by sub-run index then
    step: where each step stood in the data stream (a plot's skipped windows), without the
    rest of the row."""
    query = ("SELECT m.subrun_id, m.step, m.consumed_samples FROM metrics m "
             "JOIN subrun_starts s ON s.subrun_id = m.subrun_id ORDER BY s.idx, m.step")
    return [{"subrun": subrun, "step": step, "consumed_samples": consumed}
            for subrun, step, consumed in connection.execute(query)]


def fetch_events(connection: sqlite3.Connection) -> list[dict]:
    """Every journal record as a plain dict with a ``type``, in the order written."""
    starts = {sub.id: sub for sub in fetch_subruns(connection)}
    details = {
        "incident": _by_seq(connection, "SELECT seq, kind, summary, evidence, step, ranks, nodes FROM incidents",
                            lambda k, s, e, st, r, n: {"id": None, "kind": k, "summary": s,
                                                       "evidence": from_json(e), "step": st,
                                                       "ranks": from_json(r), "nodes": from_json(n)}),
        "decision": _by_seq(connection, "SELECT seq, incident_seq, action, reason, plan FROM decisions",
                            lambda i, a, r, p: {"incident_id": i, "action": a, "reason": r,
                                                "plan": from_json(p)}),
        "event": _by_seq(connection, "SELECT seq, kind, message, data, step FROM events",
                         lambda k, m, d, s: {"kind": k, "message": m, "data": from_json(d), "step": s}),
        "checkpoint": _by_seq(connection, "SELECT seq, step, path, seconds FROM checkpoints",
                              lambda s, p, sec: {"step": s, "path": p, "seconds": sec}),
    }
    events = []
    for seq, kind, subrun_id, time in connection.execute(
        "SELECT seq, type, subrun_id, time FROM journal ORDER BY seq"
    ):
        event = {"seq": seq, "type": kind, "subrun": subrun_id, "time": time}
        if kind == "subrun_start":
            event.update(_start_fields(starts[subrun_id]))
        elif kind == "subrun_end":
            sub = starts[subrun_id]
            event.update(end_state=sub.end_state, last_step=sub.last_step, reason=sub.end_reason)
        else:
            event.update(details[kind][seq])
            if kind == "incident":
                event["id"] = seq
        events.append(event)
    return events


def _by_seq(connection: sqlite3.Connection, query: str, shape) -> dict[int, dict]:
    return {values[0]: shape(*values[1:]) for values in connection.execute(query)}


def _start_fields(sub: SubRun) -> dict:
    return {
        "cause": sub.cause, "evidence": sub.evidence, "start_checkpoint": sub.start_checkpoint,
        "start_step": sub.start_step, "plan": sub.plan, "config_diff": sub.config_diff,
        "config": sub.config,
    }


def last_activity(connection: sqlite3.Connection) -> dict[str, float]:
    """For each sub-run, the logbook time of the last thing recorded for it."""
    activity: dict[str, float] = {}
    for query in (
        "SELECT subrun_id, MAX(time) FROM journal GROUP BY subrun_id",
        "SELECT subrun_id, MAX(recorded_at) FROM metrics GROUP BY subrun_id",
    ):
        for subrun_id, time in connection.execute(query):
            activity[subrun_id] = max(time, activity.get(subrun_id, time))
    return activity


def incident_kinds(connection: sqlite3.Connection) -> list[str]:
    """The kind of every incident, in the order recorded."""
    return [kind for (kind,) in connection.execute("SELECT kind FROM incidents ORDER BY seq")]


def checkpoint_count(connection: sqlite3.Connection, subrun_id: Optional[str] = None) -> int:
    """How many checkpoints were recorded (in one sub-run, when given)."""
    query = "SELECT COUNT(*) FROM checkpoints c JOIN journal j ON j.seq = c.seq"
    if subrun_id is None:
        return connection.execute(query).fetchone()[0]
    return connection.execute(query + " WHERE j.subrun_id = ?", (subrun_id,)).fetchone()[0]


def max_metric_step(connection: sqlite3.Connection, subrun_id: str) -> Optional[int]:
    """The highest step recorded for a sub-run; None when it has none."""
    return connection.execute("SELECT MAX(step) FROM metrics WHERE subrun_id = ?", (subrun_id,)).fetchone()[0]


def decision_actions(connection: sqlite3.Connection) -> list[str]:
    """The action of every decision, in the order recorded."""
    return [action for (action,) in connection.execute("SELECT action FROM decisions ORDER BY seq")]


def checkpoint_times(connection: sqlite3.Connection) -> list[tuple[int, int, float]]:
    """(journal seq, step, time recorded) of every checkpoint, in the order recorded."""
    return list(connection.execute(
        "SELECT c.seq, c.step, j.time FROM checkpoints c JOIN journal j ON j.seq = c.seq ORDER BY c.seq"))


def event_steps(connection: sqlite3.Connection, kinds: Sequence[str]) -> list[tuple[int, Optional[int]]]:
    """(journal seq, step) of every event of one of ``kinds``, in the order recorded;
    the step is the event's own, else its data's ``step``."""
    marks = ", ".join("?" for _ in kinds)
    rows = connection.execute(f"SELECT seq, step, data FROM events WHERE kind IN ({marks}) ORDER BY seq", tuple(kinds))
    out = []
    for seq, step, data in rows:
        if step is None:
            step = (from_json(data) or {}).get("step")
        out.append((seq, step))
    return out


def step_stats(connection: sqlite3.Connection) -> dict[str, StepStats]:
    """:class:`logbook.accounting.StepStats` per sub-run: one aggregate over the
    metrics, then each sub-run's lowest step by its primary key.
    TOTAL() reads the NaN and negative-zero texts as 0, as the accounting does."""
    totals = connection.execute(
        "SELECT subrun_id, COUNT(*), MIN(step), MAX(step), TOTAL(step_time) FROM metrics GROUP BY subrun_id").fetchall()
    stats = {}
    for subrun_id, rows, first_step, last_step, seconds in totals:
        time, recorded_at, step_time = connection.execute(
            "SELECT time, recorded_at, step_time FROM metrics WHERE subrun_id = ? AND step = ?",
            (subrun_id, first_step)).fetchone()
        first = {"time": decode_float(time), "recorded_at": recorded_at, "step_time": decode_float(step_time)}
        stats[subrun_id] = StepStats(rows, first_step, last_step, seconds, first_began(first))
    return stats


def step_range(connection: sqlite3.Connection, subrun_id: str, above: Optional[int],
               up_to: Optional[int]) -> RangeTotals:
    """Rows of one sub-run with above < step <= up_to (None: no limit), by its primary key."""
    query = "SELECT COUNT(*), TOTAL(step_time), MAX(step) FROM metrics WHERE subrun_id = ?"
    params: list = [subrun_id]
    if above is not None:
        query, params = query + " AND step > ?", [*params, above]
    if up_to is not None:
        query, params = query + " AND step <= ?", [*params, up_to]
    rows, seconds, last = connection.execute(query, params).fetchone()
    return RangeTotals(rows, seconds, last)


def metric_buckets(connection: sqlite3.Connection, metric: str, width: int) -> dict[str, dict[int, list]]:
    """Sub-run id -> first step of each bucket of ``width`` steps -> its lowest and highest
    (step, value) points in step order: two grouped scans (SQLite takes a bare column
    from the row that gave MIN or MAX). A NaN (stored as text) sorts above every number.
    ``metric`` must be a column of the metrics table (the caller checks it)."""
    found: dict[str, dict[int, set]] = {}
    for pick in ("MIN", "MAX"):
        for subrun_id, bucket, step, value in connection.execute(
                f"SELECT subrun_id, step / ? AS bucket, step, {pick}({metric}) FROM metrics NOT INDEXED "
                "GROUP BY subrun_id, bucket", (width,)):
            if value is not None:
                found.setdefault(subrun_id, {}).setdefault(bucket * width, set()).add((step, decode_float(value)))
    return {sid: {key: sorted(points) for key, points in buckets.items()} for sid, buckets in found.items()}


def metric_points(connection: sqlite3.Connection, metric: str, subrun_id: str, first: int, last: int) -> list:
    """(step, value) of one sub-run's rows with first <= step <= last, NULLs left out."""
    return [(step, decode_float(value)) for step, value in connection.execute(
        f"SELECT step, {metric} FROM metrics WHERE subrun_id = ? AND step BETWEEN ? AND ? AND {metric} IS NOT NULL "
        "ORDER BY step", (subrun_id, first, last))]


def edge_metrics(connection: sqlite3.Connection) -> tuple[list[dict], dict[str, int]]:
    """Each sub-run's first and last metrics rows, and its number of rows: what a
    chronicle tells of its training, without reading every row."""
    stats = step_stats(connection)
    rows = []
    for subrun_id, own in stats.items():
        rows += fetch_metrics(connection, subrun_id, steps=sorted({own.first_step, own.last_step}))
    return rows, {subrun_id: own.rows for subrun_id, own in stats.items()}
