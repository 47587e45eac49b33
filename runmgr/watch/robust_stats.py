"""Robust location and scale for small windows (median / MAD).

A loss curve's noise has heavy tails and a drifting level; the median and the
median absolute deviation ignore the very outliers the detectors look for,
where a mean and a standard deviation would be dragged by them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

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


def medians_without_each(values: Sequence[float]) -> list[float]:
    """For each value, the median of the others (index as ``values``, at least two of them), in
    O(n log n): one sort, then each median read off the sorted order with that value left out.
    A straggler check over thousands of ranks or nodes takes one per step."""
    if len(values) < 2:
        raise ValueError("the median of the others needs at least two values")
    order = sorted(range(len(values)), key=values.__getitem__)
    ordered = [values[i] for i in order]
    position = [0] * len(values)
    for place, index in enumerate(order):
        position[index] = place
    rest = len(values) - 1
    middle = rest // 2

    def kth_without(k: int, gone: int) -> float:
        return ordered[k] if k < gone else ordered[k + 1]

    out = []
    for index in range(len(values)):
        gone = position[index]
        if rest % 2:
            out.append(kth_without(middle, gone))
        else:
            out.append((kth_without(middle - 1, gone) + kth_without(middle, gone)) / 2.0)
    return out


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
