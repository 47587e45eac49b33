"""Robust location and scale for small windows (median / MAD).

A loss curve's noise has heavy tails and a drifting level; the median and the
median absolute deviation ignore the very outliers the detectors look for,
where a mean and a standard deviation would be dragged by them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

# MAD * 1.4826 estimates the standard deviation of a normal distribution.
MAD_TO_SIGMA = 1.4826


def median(values: Iterable[float]) -> float:
    """Median of a non-empty collection."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("median of an empty collection")
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2.0


def robust_sigma(values: Iterable[float], center: float) -> float:
    """Standard-deviation equivalent of the MAD around ``center``.

    Floored at a tiny fraction of ``center`` so that a flat window (all
    values equal) does not make every later wobble infinitely significant.
    """
    spread = median(abs(v - center) for v in values) * MAD_TO_SIGMA
    return max(spread, 1e-9 * max(1.0, abs(center)))


def is_finite(value: float | None) -> bool:
    """True for a real, finite number."""
    return value is not None and math.isfinite(value)
