"""The ``local_norms`` table: every weight's gradient norm at the steps that reported them.

Plain functions on a connection, as in :mod:`logbook.queries`; the store writes
through :func:`insert_local_norms` and readers call :func:`fetch_local_norms`
(``book.query(fetch_local_norms, ...)``) or :func:`branch_series`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from typing import Optional

from logbook.accounting import split_metrics
from logbook.errors import LogbookError
from logbook.records import SubRun, decode_float, encode_float

_INSERT = "INSERT OR IGNORE INTO local_norms (subrun_id, step, name, norm, recorded_at) VALUES (?, ?, ?, ?, ?)"
"""OR IGNORE: a step re-reported in the same sub-run keeps its first rows."""


def insert_local_norms(connection: sqlite3.Connection, subrun_id: str, step: int, norms: Mapping[str, float],
                       recorded_at: float) -> int:
    """Insert one step's norms (inside the caller's transaction); returns how many were new."""
    try:
        values = [(subrun_id, int(step), str(name), encode_float(norm), recorded_at) for name, norm in norms.items()]
    except (TypeError, ValueError) as err:
        raise LogbookError(f"local norms of step {step!r} must be numbers by weight name: {err}") from None
    before = connection.total_changes
    connection.executemany(_INSERT, values)
    return connection.total_changes - before


def fetch_local_norms(connection: sqlite3.Connection, subrun_id: Optional[str] = None) -> list[dict]:
    """One row per recorded step, ``{"subrun", "step", "norms": {name: norm}}``, by sub-run
    index then step (weights in the order they were recorded, i.e. model order)."""
    query = ("SELECT n.subrun_id, n.step, n.name, n.norm FROM local_norms n "
             "JOIN subrun_starts s ON s.subrun_id = n.subrun_id")
    params: tuple = ()
    if subrun_id is not None:
        query += " WHERE n.subrun_id = ?"
        params = (subrun_id,)
    rows: dict[tuple[str, int], dict] = {}
    for sid, step, name, norm in connection.execute(query + " ORDER BY s.idx, n.step, n.rowid", params):
        row = rows.setdefault((sid, step), {"subrun": sid, "step": step, "norms": {}})
        row["norms"][name] = decode_float(norm)
    return list(rows.values())


def branch_series(lineage: Sequence[SubRun], rows: Sequence[dict], subrun_id: str) -> dict[int, dict[str, float]]:
    """The norms by step as ``subrun_id`` saw its history: its own steps, and before its
    start those of the sub-runs it resumed from (what they trained past it was redone)."""
    position = next((i for i, sub in enumerate(lineage) if sub.id == subrun_id), None)
    if position is None:
        raise LogbookError(f"no sub-run {subrun_id!r} in this logbook: `runmgr logbook list RUN` lists them")
    kept, _ = split_metrics(lineage[:position + 1], rows)
    return {row["step"]: row["norms"] for row in kept}
