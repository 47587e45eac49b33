"""Stage verdicts of seed 004's comparison (pure functions of the numbers).

The stages, in the order a difference propagates: **forward** (step-1 loss:
same weights, same batch), **backward** (step-1 gradient norm of each weight,
the "local norm"), **optimizer** (step-2 loss: one update later), **long-run**
(loss and global gradient norm over N steps at LR 0, judged against the
reference's own run-to-run noise band). The first stage that differs is where
to look; the weights whose local norm or update differs most say what to look at.

Tolerances: two runs on this machine in deterministic mode are compared bit
for bit (tolerance 0). A Megatron log prints ``lm loss`` with 7 significant
digits and ``grad norm`` with 3 decimals: a value there is the same when it
is within one unit of the last printed digit.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Optional, Sequence

FORWARD, BACKWARD, OPTIMIZER, LONG_RUN = "forward", "backward", "optimizer", "long-run"
STAGES = (FORWARD, BACKWARD, OPTIMIZER, LONG_RUN)
SAME, CONSISTENT, DIFFERS, NOT_COMPARED = "same", "consistent", "differs", "not compared"
LOG_GRAD_NORM_TOLERANCE = 1e-3
"""One unit of Megatron's printed ``grad norm`` (``{:.3f}``)."""
WEIGHTS_SHOWN = 3
"""Weights named per measure in "the weights involved"."""


def log_loss_tolerance(printed: float) -> float:
    """One unit of the 7th significant digit of a loss Megatron printed (``{:.6E}``)."""
    if printed == 0 or not math.isfinite(printed):
        return 0.0
    return 10.0 ** (math.floor(math.log10(abs(printed))) - 6)


@dataclass(frozen=True)
class StageVerdict:
    """One row of the table."""

    stage: str
    """forward, backward, optimizer or long-run."""
    measure: str
    """What was compared, e.g. ``step-1 loss``."""
    a: str
    """The reference's value, as shown."""
    b: str
    """The other side's value, as shown."""
    verdict: str
    """same, consistent (long-run only: inside the band, around zero), differs, or not compared."""
    detail: str = ""
    """Why, in a few words (the difference, the step it leaves the band, ...)."""

    @property
    def differs(self) -> bool:
        return self.verdict == DIFFERS

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class WeightDifference:
    """A weight whose step-1 local norm or step-1 update differs between the sides."""

    name: str
    measure: str
    """``local norm`` (step 1's gradient) or ``update`` (step 1's change, seen at step 2)."""
    a: float
    b: float

    @property
    def relative(self) -> float:
        return relative_difference(self.a, self.b)

    def to_dict(self) -> dict:
        return {**asdict(self), "relative": self.relative}


@dataclass(frozen=True)
class Band:
    """The reference's run-to-run noise at each step of the long run: the
    largest |difference| of its two twin runs up to that step (noise that
    appeared once may appear again), for the loss and the grad norm."""

    loss: tuple[float, ...]
    grad_norm: tuple[float, ...]

    @classmethod
    def of_twins(cls, losses: tuple[Sequence[float], Sequence[float]],
                 grad_norms: tuple[Sequence[float], Sequence[float]]) -> "Band":
        return cls(_envelope(*losses), _envelope(*grad_norms))

    def to_dict(self) -> dict:
        return {"loss": list(self.loss), "grad_norm": list(self.grad_norm)}


def _envelope(first: Sequence[float], second: Sequence[float]) -> tuple[float, ...]:
    out, widest = [], 0.0
    for x, y in zip(first, second):
        widest = max(widest, abs(x - y))
        out.append(widest)
    return tuple(out)


def relative_difference(a: float, b: float) -> float:
    """|a - b| relative to the larger magnitude (0 when both are 0)."""
    scale = max(abs(a), abs(b))
    return abs(a - b) / scale if scale > 0 else 0.0


def _signed(delta: float) -> str:
    return f"B - A = {delta:+.3e}"


def compare_scalar(stage: str, measure: str, a: Optional[float], b: Optional[float],
                   tolerance: float = 0.0) -> StageVerdict:
    """Same when |a - b| <= tolerance (0: bit for bit)."""
    if a is None or b is None:
        missing = "A" if a is None else "B"
        return StageVerdict(stage, measure, _fmt(a), _fmt(b), NOT_COMPARED, f"{missing} has no {measure}")
    delta = b - a
    same = abs(delta) <= tolerance
    detail = ("as printed" if tolerance else "bit for bit") if same else _signed(delta)
    return StageVerdict(stage, measure, _fmt(a), _fmt(b), SAME if same else DIFFERS, detail)


def compare_local_norms(a: dict[str, float], b: dict[str, float]) -> StageVerdict:
    """The backward stage between two runs: every weight's step-1 local norm, bit for bit."""
    measure = "step-1 local norm per weight"
    shown_a, shown_b = _global(a.values()), _global(b.values())
    only = sorted(set(a) ^ set(b))
    if only:
        return StageVerdict(BACKWARD, measure, shown_a, shown_b, DIFFERS,
                            f"the weights differ ({', '.join(only[:WEIGHTS_SHOWN])}{' ...' if len(only) > WEIGHTS_SHOWN else ''} "
                            f"on one side only)")
    differing = [name for name in a if a[name] != b[name]]
    if not differing:
        return StageVerdict(BACKWARD, measure, shown_a, shown_b, SAME, f"all {len(a)} weights bit for bit")
    return StageVerdict(BACKWARD, measure, shown_a, shown_b, DIFFERS, f"{len(differing)} of {len(a)} weights")


def _global(norms) -> str:
    """The global norm the local norms add up to, as shown in the A/B columns."""
    return f"{math.sqrt(sum(n * n for n in norms)):.8f} (global)"


def dtypes_apart(a: dict[str, str], b: dict[str, str]) -> list[tuple[str, str, str]]:
    """The weights (common to both sides) held in another dtype: (name, A's dtype, B's dtype).
    A weight kept in bf16 on one side changes the forward pass from step 1 on (seed 004's embedding)."""
    return [(name, a[name], b[name]) for name in a if name in b and a[name] != b[name]]


def weights_involved(a: dict[str, float], b: dict[str, float], measure: str) -> list[WeightDifference]:
    """The weights (common to both sides) whose ``measure`` differs most, largest relative difference first."""
    found = [WeightDifference(name, measure, a[name], b[name]) for name in a if name in b and a[name] != b[name]]
    found.sort(key=lambda w: w.relative, reverse=True)
    return found[:WEIGHTS_SHOWN]


def compare_long_run(a_losses: Sequence[float], a_norms: Sequence[float], b_losses: Sequence[float],
                     b_norms: Sequence[float], band: Band, log_precision: bool = False) -> StageVerdict:
    """Seed 004's long run: B - A at every step inside the reference's band (plus
    the printing precision of a log) and oscillating around zero is noise."""
    steps = min(len(a_losses), len(b_losses), len(band.loss))
    measure = f"loss and grad norm, {steps} steps at LR 0"
    if steps == 0:
        return StageVerdict(LONG_RUN, measure, "", "", NOT_COMPARED, "B has no run at LR 0")
    shown = [f"{_fmt(_mean(losses[:steps]))} (mean loss)" for losses in (a_losses, b_losses)]
    series = (("loss", a_losses, b_losses, band.loss), ("grad norm", a_norms, b_norms, band.grad_norm))

    def floor(what: str, printed: float) -> float:
        return _print_floor(what, printed) if log_precision else 0.0

    for step in range(steps):
        for what, a, b, width in series:
            delta = b[step] - a[step]
            if not abs(delta) <= width[step] + floor(what, b[step]):
                return StageVerdict(LONG_RUN, measure, *shown, DIFFERS, f"leaves the band at step {step + 1}: "
                                    f"{what} {_signed(delta)}, band {width[step]:.3e}")
    moved = {what: [b[s] - a[s] for s in range(steps) if abs(b[s] - a[s]) > floor(what, b[s])]
             for what, a, b, _width in series}
    if not moved["loss"] and not moved["grad norm"]:
        return StageVerdict(LONG_RUN, measure, *shown, SAME, "as printed" if log_precision else "bit for bit")
    above = {delta > 0 for delta in moved["loss"]}
    if len(moved["loss"]) > 1 and len(above) == 1:
        return StageVerdict(LONG_RUN, measure, *shown, DIFFERS, f"inside the band but one-sided (B "
                            f"{'above' if True in above else 'below'} A): a drift, not noise")
    return StageVerdict(LONG_RUN, measure, *shown, CONSISTENT, "inside the band, around zero")


def _print_floor(what: str, printed: float) -> float:
    return log_loss_tolerance(printed) if what == "loss" else LOG_GRAD_NORM_TOLERANCE


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _fmt(value: Optional[float]) -> str:
    return "" if value is None else f"{value:.8f}"


def first_difference(stages: Sequence[StageVerdict]) -> Optional[StageVerdict]:
    """The earliest stage that differs, in :data:`STAGES` order."""
    return next((stage for stage in stages if stage.differs), None)
