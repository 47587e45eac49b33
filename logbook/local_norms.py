"""Which weights moved first and most around a step: seed 004's local norms, read.

Pure analysis of per-step, per-weight gradient norms (``{step: {weight: norm}}``).
Each weight's baseline is the median of its norm over the ``window`` recorded steps
before the step in question; its ratio at a later step is the norm there over that
baseline. A weight "moved" at the earliest recorded step, at or after the step in
question, whose ratio exceeds ``threshold``; the weights that moved *first* are those
with the earliest such step (the layer a bad batch or a precision problem enters by),
the weights that moved *most* those with the highest ratio over the steps examined.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional

DEFAULT_THRESHOLD = 3.0
"""A weight moved when its norm is this many times its baseline."""
DEFAULT_WINDOW = 10
"""Recorded steps before the step in question whose median is each weight's baseline."""
DEFAULT_HORIZON = 20
"""Recorded steps at and after the step in question that are examined."""
TOP = 5
"""Weights named in an incident's evidence, for first and for most."""

Series = Mapping[int, Mapping[str, float]]
"""Per-weight gradient norms by step."""


@dataclass(frozen=True)
class WeightMove:
    """How one weight's gradient norm moved against its own baseline."""

    name: str
    baseline: float
    """Median norm over the window before the step."""
    peak_step: int
    peak_ratio: float
    """The highest norm / baseline at or after the step (inf: a non-finite norm, or a zero baseline)."""
    first_step: Optional[int]
    """The earliest step whose ratio exceeds the threshold; None when none does."""
    first_ratio: Optional[float]

    def to_dict(self) -> dict:
        return {"name": self.name, "baseline": self.baseline, "peak_step": self.peak_step,
                "peak_ratio": self.peak_ratio, "first_step": self.first_step, "first_ratio": self.first_ratio}


@dataclass(frozen=True)
class NormMoves:
    """Every weight's move around ``step``."""

    step: int
    threshold: float
    baseline_steps: tuple[int, ...]
    """The recorded steps the baselines are the median of."""
    examined_steps: tuple[int, ...]
    """The recorded steps at and after ``step`` that were examined."""
    weights: tuple[WeightMove, ...]
    """One per weight, in model order."""

    @property
    def first_step(self) -> Optional[int]:
        """The earliest step at which any weight moved; None when none did."""
        return min((w.first_step for w in self.weights if w.first_step is not None), default=None)

    @property
    def first(self) -> list[WeightMove]:
        """The weights that moved at :attr:`first_step`, the largest ratio first."""
        at = self.first_step
        moved = [w for w in self.weights if at is not None and w.first_step == at]
        return sorted(moved, key=lambda w: -(w.first_ratio or 0.0))

    @property
    def most(self) -> list[WeightMove]:
        """Every weight, the largest peak ratio first."""
        return sorted(self.weights, key=lambda w: -w.peak_ratio)

    def evidence(self, top: int = TOP) -> dict:
        """What an incident's evidence says (key ``local_norms``): the weights that moved
        first and most, with their ratios."""
        return {
            "step": self.step, "threshold": self.threshold, "first_step": self.first_step,
            "baseline_steps": [self.baseline_steps[0], self.baseline_steps[-1]],
            "examined_steps": [self.examined_steps[0], self.examined_steps[-1]],
            "first": [{"name": w.name, "ratio": w.first_ratio} for w in self.first[:top]],
            "most": [{"name": w.name, "ratio": w.peak_ratio, "step": w.peak_step} for w in self.most[:top]],
        }

    def to_dict(self) -> dict:
        return {**self.evidence(top=len(self.weights)), "weights": [w.to_dict() for w in self.weights]}


def analyse(series: Series, step: int, threshold: float = DEFAULT_THRESHOLD, window: int = DEFAULT_WINDOW,
            horizon: int = DEFAULT_HORIZON, until: Optional[int] = None) -> Optional[NormMoves]:
    """The moves of every weight around ``step``: baselines over the ``window`` recorded
    steps before it, ratios over the ``horizon`` recorded steps from it (none after
    ``until``). None when no step is recorded before it or none at or after it."""
    before = sorted(s for s in series if s < step)[-window:] if window > 0 else []
    after = sorted(s for s in series if s >= step and (until is None or s <= until))[:horizon]
    if not before or not after:
        return None
    names = list(dict.fromkeys(name for s in after for name in series[s]))
    weights = []
    for name in names:
        history = [series[s][name] for s in before if name in series[s] and math.isfinite(series[s][name])]
        if not history:
            continue
        baseline = statistics.median(history)
        ratios = [(s, _ratio(series[s][name], baseline)) for s in after if name in series[s]]
        peak_step, peak_ratio = max(ratios, key=lambda item: item[1])
        first = next(((s, r) for s, r in ratios if r > threshold), (None, None))
        weights.append(WeightMove(name, baseline, peak_step, peak_ratio, *first))
    return NormMoves(step, threshold, tuple(before), tuple(after), tuple(weights))


def _ratio(norm: float, baseline: float) -> float:
    if not math.isfinite(norm):
        return math.inf
    if baseline <= 0.0:
        return math.inf if norm > 0.0 else 1.0
    return norm / baseline
