"""What the logbook hands back: sub-runs as dataclasses, everything else as
plain dicts; and the encoding of values into SQLite columns and back."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Optional

from logbook.errors import LogbookError

KNOWN_END_STATES = ("finished", "failed", "restarting", "stopped", "abandoned", "aborted")
"""End states the renderers phrase specially; other lowercase words are accepted."""

METRIC_FLOATS = ("loss", "grad_norm", "lr", "loss_scale", "tokens_per_s", "step_time", "time", "mfu")
METRIC_INTS = ("tokens", "consumed_samples", "peak_memory_bytes")
METRIC_FIELDS = ("step",) + METRIC_FLOATS + METRIC_INTS + ("skipped",)
"""Columns of one metrics row, besides its sub-run."""
METRIC_COLUMNS = ("subrun_id",) + METRIC_FIELDS + ("recorded_at",)
"""Columns of the metrics table, in the order of :func:`metric_values`."""
SQLITE_INTEGER = (-(2**63), 2**63 - 1)
"""What an INTEGER column holds; Python's ints go further (a job may print any number)."""


def storable(value: int) -> bool:
    """True when SQLite can hold ``value`` in an INTEGER column."""
    return SQLITE_INTEGER[0] <= value <= SQLITE_INTEGER[1]


def unholdable(value: Any) -> bool:
    """True for a number no INTEGER column holds: a whole number past what SQLite holds, a float
    that is NaN, infinite or past it (a job may print any number)."""
    if isinstance(value, float):
        return not math.isfinite(value) or not storable(int(value))
    return isinstance(value, int) and not storable(value)


def out_of_range(row: Any) -> list[str]:
    """The whole-number fields of a metrics row (its step, its counts) that no column holds: the
    logbook leaves out a row whose step is one of them, and records such a count as none."""
    if not isinstance(row, dict):
        return []
    return [name for name in ("step",) + METRIC_INTS if unholdable(row.get(name))]


def real(value: Any) -> Optional[float]:
    """``value`` as a REAL column holds it: a whole number past a double's range is infinite on its
    side (as ``float("1e400")`` is), not an error."""
    if value is None:
        return None
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


@dataclass(frozen=True)
class SubRun:
    """One launch or relaunch of a run, as the logbook knows it."""

    id: str
    """``"12.03"``: run number, dot, two-digit (or longer) index."""
    index: int
    """3 for ``12.03``."""
    started_at: float
    """Logbook clock (unix seconds) when the sub-run was started."""
    cause: str
    """Why it started, in words (``launch``, ``worker lost``, ``loss spike``)."""
    evidence: dict
    """The facts behind the cause (exception, rank, pid, losses ...)."""
    start_checkpoint: Optional[str]
    """Checkpoint it resumed from (relative to the run directory when inside it)."""
    start_step: int
    """Step of that checkpoint (0 for a fresh start)."""
    plan: dict
    """The resume plan: skip ranges, LR scale, optimizer reset, excluded nodes ..."""
    config: dict
    """The full config the sub-run ran with."""
    config_diff: dict = field(default_factory=dict)
    """``{"optim.lr": [old, new]}`` against the previous sub-run; {} for the first."""
    ended_at: Optional[float] = None
    """Logbook clock at its end; None while no end is recorded."""
    end_state: Optional[str] = None
    """``finished``, ``failed``, ``restarting``, ``stopped`` (a person asked, by a signal),
    ``abandoned`` (the driver died) ...; None while open."""
    last_step: Optional[int] = None
    """Last step it completed, as recorded at its end."""
    end_reason: Optional[str] = None
    """Why it ended, in words."""

    @property
    def is_open(self) -> bool:
        """True while no end is recorded (running, or its driver died)."""
        return self.end_state is None


def to_json(value: Any, what: str) -> str:
    """Plain data to JSON text; anything else is the caller's bug, said clearly."""
    try:
        return json.dumps(value)  # insertion order kept: evidence reads as it was written
    except (TypeError, ValueError) as err:
        raise LogbookError(
            f"{what} must be plain JSON data (dict/list/str/number/bool/None): {err}"
        ) from None


def from_json(text: Optional[str]) -> Any:
    """Inverse of :func:`to_json`; NULL reads as None."""
    return None if text is None else json.loads(text)


_NAN_TEXT = "NaN"
_NEGATIVE_ZERO_TEXT = "negative zero"
"""Texts SQLite will not read as numbers: "-0.0" would come back as 0.0."""


def encode_float(value: Any) -> Any:
    """A float for a REAL column, exactly recoverable by :func:`decode_float`.

    SQLite stores NaN as NULL and -0.0 as 0.0, so those two go in as
    non-numeric text.
    """
    if value is None:
        return None
    number = float(value)
    if math.isnan(number):
        return _NAN_TEXT
    if number == 0.0 and math.copysign(1.0, number) < 0:
        return _NEGATIVE_ZERO_TEXT
    return number


def decode_float(value: Any) -> Optional[float]:
    """Inverse of :func:`encode_float`."""
    if value is None:
        return None
    if value == _NAN_TEXT:
        return math.nan
    if value == _NEGATIVE_ZERO_TEXT:
        return -0.0
    return float(value)


def normalise_metric_row(subrun_id: str, row: dict) -> dict:
    """Check one metrics row and fill what can be derived (tokens_per_s)."""
    if not isinstance(row, dict) or "step" not in row:
        raise LogbookError(
            f"metrics row for sub-run {subrun_id} needs at least a 'step' key, got {row!r}"
        )
    if row.get("subrun", subrun_id) != subrun_id:
        raise LogbookError(
            f"metrics row says sub-run {row['subrun']!r} but was recorded under "
            f"{subrun_id!r}: record it under its own sub-run"
        )
    clean = {name: row.get(name) for name in METRIC_FIELDS}
    if unholdable(row["step"]):
        raise LogbookError(f"metrics row for sub-run {subrun_id} has step {row['step']!r}, not a step the logbook "
                           f"holds (a whole number from -2^63 to 2^63 - 1): the row is not recorded")
    try:
        clean["step"] = int(row["step"])
        for name in METRIC_INTS:  # a count no column holds is no count: none recorded (out_of_range names it)
            clean[name] = None if clean[name] is None or unholdable(clean[name]) else int(clean[name])
        for name in METRIC_FLOATS:
            clean[name] = real(clean[name])
    except (TypeError, ValueError) as err:
        raise LogbookError(f"metrics row for step {row.get('step')!r} has a non-number: {err}") from None
    clean["skipped"] = bool(row.get("skipped", False))
    if clean["tokens_per_s"] is None and clean["tokens"] is not None and clean["step_time"]:
        clean["tokens_per_s"] = clean["tokens"] / clean["step_time"]
    return clean


def metric_values(subrun_id: str, row: dict, recorded_at: float) -> tuple:
    """A normalised metrics row as the values of :data:`METRIC_COLUMNS`."""
    values = [subrun_id]
    for name in METRIC_FIELDS:
        value = row[name]
        values.append(encode_float(value) if name in METRIC_FLOATS else value)
    values[METRIC_COLUMNS.index("skipped")] = int(row["skipped"])
    return (*values, recorded_at)
