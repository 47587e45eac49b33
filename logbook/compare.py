"""Judging two runs step by step against the noise of a baseline pair (seed 004).

Pure functions over per-step series (``{step: value}`` of one metric, e.g.
loss or grad norm); nothing here reads a logbook (logbook/compare_runs.py does).

The rules, exactly:

- **difference** at a step: ``B - A`` (the run judged minus the reference),
  on the steps every series has. Two NaNs at one step are the same value
  (difference 0); one NaN is an infinite difference.
- **band** (only with a baseline pair C, D: two runs of the reference that
  differ only by run-to-run noise): the running maximum of ``|D - C|``, i.e.
  ``band[s] = max(|D_t - C_t| for t <= s)``. The noise of a training run grows
  as it goes (rounding differences are amplified step after step), so the
  band may widen, never narrow. A difference is *outside* when
  ``|B - A| > band``; with two identical baseline runs the band is 0 and any
  difference is outside.
- **verdict**:

  - ``identical``: every difference is exactly 0.
  - ``diverging from step N`` (with a band): N is the first step that is
    outside the band and after which the difference stays out: at least
    :data:`STAY_OUT` of the steps from N on are outside, and there are at
    least :data:`MIN_STEPS_OUT` of them.
  - ``one-sided`` (with a band): inside the band but not oscillating around
    zero: the sign test rejects "as many positive as negative differences" at
    level :data:`SIGN_TEST_ALPHA` (a small systematic bias).
  - ``consistent``: inside the band (no lasting exit) and oscillating around
    zero.
  - ``different from step N`` (no baseline, so no band): the first step whose
    difference is not exactly 0. Whether that is noise cannot be told without
    a baseline pair.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Mapping, Optional, Sequence

Series = Mapping[int, float]
"""One metric of one run: step -> value (the kept lineage's rows)."""
VerdictKind = Literal["identical", "consistent", "one-sided", "diverging", "different"]

STAY_OUT = 0.9
"""Fraction of the steps from N on that must be outside the band for "diverging from step N"."""
MIN_STEPS_OUT = 3
"""Fewest steps outside the band, from N on, that make a divergence (one stray step is not one)."""
SIGN_TEST_ALPHA = 0.01
"""Level of the two-sided sign test that calls differences one-sided instead of oscillating."""
SEVERITY: dict[str, int] = {"identical": 0, "consistent": 1, "one-sided": 2, "different": 3, "diverging": 4}
"""How the verdicts of several metrics combine: the most severe one is the pair's verdict."""


@dataclass(frozen=True)
class Verdict:
    """What the comparison of one metric (or of the whole pair) concludes."""

    kind: VerdictKind
    step: Optional[int] = None
    """The step a divergence or difference starts at (``diverging``, ``different``)."""
    why: str = ""
    """The figures behind the verdict, in one sentence."""

    def text(self) -> str:
        """``identical``, ``consistent``, ``one-sided``, ``diverging from step N``, ``different from step N``."""
        return f"{self.kind} from step {self.step}" if self.step is not None else self.kind

    def to_dict(self) -> dict:
        return {"verdict": self.text(), "kind": self.kind, "step": self.step, "why": self.why}


@dataclass(frozen=True)
class MetricComparison:
    """One metric of the pair, step by step."""

    metric: str
    steps: tuple[int, ...]
    a: tuple[float, ...]
    b: tuple[float, ...]
    diff: tuple[float, ...]
    """``B - A`` at each step."""
    band: Optional[tuple[float, ...]]
    """The baseline pair's running-max envelope of ``|D - C|`` at each step; None without a baseline."""
    verdict: Verdict

    def outside(self) -> tuple[bool, ...]:
        """Whether each step's difference is outside the band (all False without one)."""
        if self.band is None:
            return tuple(False for _ in self.steps)
        return tuple(_outside(d, w) for d, w in zip(self.diff, self.band))

    def to_dict(self) -> dict:
        return {"metric": self.metric, "steps": list(self.steps), "a": list(self.a), "b": list(self.b),
                "diff": list(self.diff), "band": None if self.band is None else list(self.band),
                "outside": list(self.outside()), **self.verdict.to_dict()}


def difference(a: float, b: float) -> float:
    """``b - a``; 0 for two NaNs (the same value), infinite for one NaN."""
    if math.isnan(a) or math.isnan(b):
        return 0.0 if math.isnan(a) and math.isnan(b) else math.inf
    return b - a


def common_steps(*series: Series) -> list[int]:
    """The steps every series has, in order."""
    steps = set(series[0])
    for one in series[1:]:
        steps &= set(one)
    return sorted(steps)


def band(c: Series, d: Series, steps: Sequence[int]) -> list[float]:
    """The running maximum of ``|D - C|`` over ``steps`` (each must be in both series)."""
    envelope, widest = [], 0.0
    for step in steps:
        widest = max(widest, abs(difference(c[step], d[step])))
        envelope.append(widest)
    return envelope


def compare_metric(metric: str, a: Series, b: Series, baseline: Optional[tuple[Series, Series]] = None
                   ) -> MetricComparison:
    """The step-by-step comparison of ``metric`` of runs A and B (and the band of C, D)."""
    pair = (a, b) + (tuple(baseline) if baseline is not None else ())
    steps = common_steps(*pair)
    diffs = [difference(a[s], b[s]) for s in steps]
    envelope = band(baseline[0], baseline[1], steps) if baseline is not None else None
    judged = judge(steps, diffs, envelope)
    return MetricComparison(metric, tuple(steps), tuple(a[s] for s in steps), tuple(b[s] for s in steps),
                            tuple(diffs), None if envelope is None else tuple(envelope), judged)


def judge(steps: Sequence[int], diffs: Sequence[float], envelope: Optional[Sequence[float]]) -> Verdict:
    """The verdict of the differences at ``steps`` against ``envelope`` (None: no baseline)."""
    if not steps:
        raise ValueError("no step to compare: the runs share no recorded step")
    if all(d == 0 for d in diffs):
        return Verdict("identical", why=f"all {len(steps)} steps equal bit for bit")
    if envelope is None:
        first = next(s for s, d in zip(steps, diffs) if d != 0)
        largest = max(abs(d) for d in diffs)
        return Verdict("different", first, f"first difference at step {first}, largest |B-A| {largest:.3g}; "
                                           "no baseline pair, so no noise band to judge it against")
    outside = [_outside(d, w) for d, w in zip(diffs, envelope)]
    start = divergence_start(outside)
    if start is not None:
        tail = outside[start:]
        return Verdict("diverging", steps[start],
                       f"outside the band at step {steps[start]} and at {sum(tail)} of the {len(tail)} "
                       f"steps from there")
    positive, negative = sum(d > 0 for d in diffs), sum(d < 0 for d in diffs)
    p_value = sign_test(positive, negative)
    counts = f"{positive} steps above zero, {negative} below (sign test p={p_value:.2g})"
    stray = f"; {sum(outside)} stray step(s) outside the band" if any(outside) else ""
    if p_value < SIGN_TEST_ALPHA:
        return Verdict("one-sided", why=f"inside the band but {counts}{stray}")
    return Verdict("consistent", why=f"inside the band, {counts}{stray}")


def divergence_start(outside: Sequence[bool]) -> Optional[int]:
    """Index of the first outside step from which at least :data:`STAY_OUT` of the
    steps (and at least :data:`MIN_STEPS_OUT`) are outside; None when none is."""
    remaining_out = sum(outside)
    for index, out in enumerate(outside):
        if out and remaining_out >= MIN_STEPS_OUT and remaining_out >= STAY_OUT * (len(outside) - index):
            return index
        remaining_out -= out
    return None


def sign_test(positive: int, negative: int) -> float:
    """Two-sided p-value of ``positive`` vs ``negative`` signs under "each sign equally likely"."""
    n = positive + negative
    if n == 0:
        return 1.0
    low = min(positive, negative)
    tail = sum(math.comb(n, k) for k in range(low + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def overall(comparisons: Sequence[MetricComparison]) -> Verdict:
    """The pair's verdict: the most severe of its metrics' (the earliest step among equals)."""
    worst = max(SEVERITY[c.verdict.kind] for c in comparisons)
    chosen = [c for c in comparisons if SEVERITY[c.verdict.kind] == worst]
    first = min(chosen, key=lambda c: c.verdict.step if c.verdict.step is not None else math.inf)
    return Verdict(first.verdict.kind, first.verdict.step, f"{first.metric}: {first.verdict.why}")


def _outside(diff: float, width: float) -> bool:
    return abs(diff) > width
