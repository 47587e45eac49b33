"""An incident for people: its facts as rows of a table (when in local time,
kind, sub-run, step, ranks, nodes), each decision with its reason and the
changes it made, and the evidence flattened into key/value rows where a
number that is a moment (an epoch time) reads as a local date and time."""

from __future__ import annotations

import json
from typing import Any, Optional, Sequence

from logbook.records import SubRun
from logbook.textfmt import clock_text

EPOCH_RANGE = (1e9, 1e10)
"""Seconds since 1970 that are plausible moments (2001 to 2286): only these are shown as dates."""
MOMENT_KEYS = ("time", "_at", "since", "until", "deadline", "timestamp")
"""Evidence keys whose numbers are moments (a key ending in one of these)."""
MAX_DEPTH = 3
"""Nested evidence is flattened to dotted keys this deep; deeper parts are shown as JSON."""

Row = tuple[str, str]


def label(kind: str, summary: str) -> str:
    """``kind: summary``, or the summary alone when it already begins with the kind
    (runmgr's summaries do: ``worker_death: rank 1 ...`` must not read ``worker_death: worker_death: ...``)."""
    return summary if summary.startswith(kind) else f"{kind}: {summary}"


def moment(value: float) -> str:
    """A local date and time, with the seconds since 1970 it was written as."""
    return f"{clock_text(value, with_date=True)} (epoch {value:.0f})"


def is_moment(key: str, value: Any) -> bool:
    """Whether evidence ``key: value`` is a point in time."""
    leaf = key.rsplit(".", 1)[-1].lower()
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and any(leaf.endswith(k) for k in MOMENT_KEYS) and EPOCH_RANGE[0] <= value <= EPOCH_RANGE[1])


def text(value: Any) -> str:
    """One cell: lists of plain values joined by commas, nothing as ``-``, the rest as JSON."""
    if value is None or value == [] or value == {}:
        return "-"
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, (str, int, float)) for v in value):
        return ", ".join(str(v) for v in value)
    if isinstance(value, (int, float, bool)):
        return str(value)
    return json.dumps(value, default=str)


def flatten(record: Any, prefix: str = "", depth: int = 0) -> list[Row]:
    """``record`` as (dotted key, cell) rows, moments as local times."""
    if not isinstance(record, dict) or (depth >= MAX_DEPTH and prefix):
        return [(prefix or "value", moment(record) if is_moment(prefix, record) else text(record))]
    if not record and prefix:
        return [(prefix, "-")]
    rows: list[Row] = []
    for key, value in record.items():
        rows += flatten(value, f"{prefix}.{key}" if prefix else str(key), depth + 1)
    return rows


def facts(incident: dict, subrun: Optional[SubRun]) -> list[Row]:
    """The incident's own facts, in the order a person asks them."""
    step = incident["step"]
    if step is None:
        stopped = subrun.last_step if subrun is not None else None
        step_text = "-" + (f" (the sub-run stopped at step {stopped})" if stopped is not None else "")
    else:
        step_text = str(step)
    return [("when", clock_text(incident["time"], with_date=True)), ("kind", incident["kind"]),
            ("sub-run", incident["subrun"]), ("step", step_text), ("ranks", text(incident["ranks"])),
            ("nodes", text(incident["nodes"])), ("summary", incident["summary"])]


def decision_rows(decisions: Sequence[dict]) -> list[dict]:
    """Each decision: ``{"action", "reason", "when", "changes"}``, changes as rows without the
    action and reason again and without what was left unset."""
    shown = []
    for decision in decisions:
        plan = decision.get("plan") or {}
        changes = [(k, v) for k, v in flatten({k: v for k, v in plan.items() if k not in ("action", "reason")})
                   if v not in ("-", "False")]
        shown.append({"action": decision["action"], "reason": decision["reason"],
                      "when": clock_text(decision["time"], with_date=True), "changes": changes})
    return shown
