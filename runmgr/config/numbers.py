"""Numbers no config field can mean, refused for every field at once.

OmegaConf types ``optim.lr=nan`` and ``controller.worker_lease_s=inf`` as
floats, and every range check written as ``x <= 0`` is silently passed by
NaN; ``run.number=99999999999999999999`` is a valid Python int that SQLite
cannot store. Rather than a check per field, :func:`number_problems` walks a
composed config's dataclass fields once (nested sections, lists and mappings
included) and names each float that is NaN or infinite and each integer
beyond 64 bits.

A field whose docstring gives NaN or an infinity a meaning declares it with
``field(default=..., metadata={NONFINITE_MEANING: "inf: never"})``; none does
today.
"""

from __future__ import annotations

import dataclasses
import math
from enum import Enum
from typing import Any, Optional

NONFINITE_MEANING = "nonfinite_meaning"
"""Field metadata key: what NaN or an infinity means for that field (the field then accepts them)."""

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
"""What the logbook (SQLite INTEGER), numpy and torch hold; a larger integer is a typo."""


def number_problems(config: Any, where: str = "") -> list[str]:
    """One line per NaN/infinite float or over-64-bit integer in ``config``
    (a dataclass instance), named by its dotted key (``optim.lr``)."""
    out: list[str] = []
    for f in dataclasses.fields(config):
        key = f"{where}.{f.name}" if where else f.name
        out += _value_problems(getattr(config, f.name), key, f.metadata.get(NONFINITE_MEANING))
    return out


def _value_problems(value: Any, key: str, nonfinite_meaning: Optional[str]) -> list[str]:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return number_problems(value, key)
    if isinstance(value, (bool, Enum, str)) or value is None:
        return []
    if isinstance(value, float):
        if math.isfinite(value) or nonfinite_meaning:
            return []
        return [f"{key} must be a finite number, got {value} (NaN and infinities mean nothing here): "
                f"set {key} to a number"]
    if isinstance(value, int):
        if INT64_MIN <= value <= INT64_MAX:
            return []
        return [f"{key} is {value}, beyond a 64-bit integer ({INT64_MAX}): set {key} to a smaller whole number"]
    if isinstance(value, (list, tuple)):
        return [p for i, item in enumerate(value) for p in _value_problems(item, f"{key}[{i}]", nonfinite_meaning)]
    if isinstance(value, dict):
        return [p for k, item in value.items() for p in _value_problems(item, f"{key}.{k}", nonfinite_meaning)]
    return []
