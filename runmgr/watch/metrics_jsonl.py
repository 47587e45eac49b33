"""Our own logbook's JSONL (``runmgr logbook metrics`` / ``events``) as observations.

A metrics row is one JSON object per line: ``subrun, step, loss, grad_norm,
lr, loss_scale, tokens, tokens_per_s, step_time, time, consumed_samples,
skipped`` (NaN as JSON's ``NaN``). Event rows (they carry a ``type``) are read
for their checkpoints (``"type": "checkpoint"``) and otherwise skipped, so a
file holding both streams replays with the checkpoints it recorded.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any, Optional

from runmgr.watch.errors import ReplayInputError
from runmgr.watch.megatron_log import LogEvent
from runmgr.watch.observations import CheckpointObservation, StepObservation


def read_jsonl(lines: Sequence[str], source: str) -> list[LogEvent]:
    """The observations of a JSONL file's lines, in time order.

    ``source`` names the file in error messages. A last line without its
    newline that does not parse is a write cut short by a crash: it is left out.
    """
    events: list[LogEvent] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            if number == len(lines) and not line.endswith("\n"):
                break
            raise ReplayInputError(f"{source}:{number}: not a JSON object ({err.msg}); expected one "
                                   f"`runmgr logbook metrics` row per line") from None
        if not isinstance(row, dict):
            raise ReplayInputError(f"{source}:{number}: expected a JSON object, got {type(row).__name__}")
        event = _event(row, events, f"{source}:{number}")
        if event is not None:
            events.append(event)
    # Metrics and events are separate streams: merge them by time (stable for equal times).
    events.sort(key=lambda e: e.time)
    return events


def _event(row: dict, earlier: list[LogEvent], where: str) -> Optional[LogEvent]:
    kind = row.get("type")
    if kind == "checkpoint":
        time = _float(row, "time", where)
        if time is None:
            raise ReplayInputError(f"{where}: a checkpoint row needs its 'time'")
        return CheckpointObservation(step=_int(row, "step", where), time=time, subrun=str(row.get("subrun", "")))
    if kind is not None or "step" not in row:
        return None
    previous = next((e for e in reversed(earlier) if isinstance(e, StepObservation)), None)
    step_time = _float(row, "step_time", where)
    time = _float(row, "time", where)
    if time is None:
        time = (previous.time if previous else 0.0) + (step_time or 1.0)
    tokens_per_s = _float(row, "tokens_per_s", where)
    tokens = row.get("tokens")
    if tokens_per_s is None and isinstance(tokens, (int, float)) and step_time:
        tokens_per_s = tokens / step_time
    consumed = row.get("consumed_samples")
    return StepObservation(
        step=_int(row, "step", where), time=time, subrun=str(row.get("subrun") or ""),
        loss=_float(row, "loss", where), grad_norm=_float(row, "grad_norm", where), lr=_float(row, "lr", where),
        loss_scale=_float(row, "loss_scale", where),
        consumed_samples=_int(row, "consumed_samples", where) if consumed is not None else None,
        step_time=step_time, tokens_per_s=tokens_per_s,
        compute_times=tuple(float(t) for t in row.get("compute_times") or ()),
        skipped_iterations=int(bool(row.get("skipped", False))),
    )


def _float(row: dict, key: str, where: str) -> Optional[float]:
    value: Any = row.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ReplayInputError(f"{where}: '{key}' must be a number, got {value!r}")
    return float(value)


def _int(row: dict, key: str, where: str) -> int:
    value = _float(row, key, where)
    if value is None or not math.isfinite(value) or value != int(value):
        raise ReplayInputError(f"{where}: '{key}' must be a whole number, got {row.get(key)!r}")
    return int(value)

