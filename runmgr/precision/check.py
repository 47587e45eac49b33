"""The precision check from end to end: pin both sides, run them, measure the
reference's noise band, judge each stage.

The band of the long run is the reference's own run-to-run noise, measured as
seed 004 prescribes: the reference's LR-0 run twice more **without**
determinism (``training.deterministic=false``), once on one thread and once
on every thread torch has here (the order of the floating-point reductions is
then free, as on a GPU without deterministic kernels). At each step the band
is the largest difference of the two twins so far. On a CPU the twins
usually agree bit for bit: the band is then 0 and says so.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional

from runmgr.precision.compare import (
    BACKWARD, FORWARD, LOG_GRAD_NORM_TOLERANCE, NOT_COMPARED, OPTIMIZER, Band, StageVerdict, WeightDifference,
    compare_local_norms, compare_long_run, compare_scalar, dtypes_apart, first_difference, log_loss_tolerance,
    weights_involved,
)
from runmgr.precision.logref import LogReference, read_megatron_log
from runmgr.precision.protocol import PINNED, Side, pinned_config

Say = Callable[[str], None]
DEFAULT_STEPS = 100
"""Long-run steps at LR 0 when ``--steps`` is not given: about half a minute here."""
THOROUGH_STEPS = 1000
"""Long-run steps at LR 0 with ``--thorough``: the ~1000 the precision guide runs on a real model
(a drift too slow to leave the band in 100 steps can show by 1000)."""


@dataclass(frozen=True)
class CheckReport:
    """Everything the table and ``--json`` show."""

    a: str
    """The reference, as the user named it."""
    b: str
    """The other side: a config as named, or ``log FILE``."""
    steps: int
    """Steps of the long run at LR 0."""
    stages: tuple[StageVerdict, ...]
    weights: tuple[WeightDifference, ...] = ()
    """The weights whose step-1 local norm or update differs most (two runs only)."""
    dtypes_apart: tuple[tuple[str, str, str], ...] = ()
    """The weights held in another dtype on each side: (name, A's, B's) (two runs only)."""
    band: Band = field(default_factory=lambda: Band((), ()))
    band_source: str = ""
    """How the band was measured, in words."""
    pinned: tuple[str, ...] = tuple(f"{key}={value}" for key, value in PINNED.items())

    @property
    def first_difference(self) -> Optional[StageVerdict]:
        return first_difference(self.stages)

    @property
    def same(self) -> bool:
        return self.first_difference is None

    def to_dict(self) -> dict:
        first = self.first_difference
        return {"a": self.a, "b": self.b, "steps": self.steps, "pinned": list(self.pinned),
                "stages": [stage.to_dict() for stage in self.stages],
                "first_difference": first.stage if first else None,
                "weights": [weight.to_dict() for weight in self.weights],
                "dtypes_apart": [{"name": name, "a": a, "b": b} for name, a, b in self.dtypes_apart],
                "band": {**self.band.to_dict(), "source": self.band_source}}


def _quiet(_line: str) -> None:
    pass


class StepProgress:
    """A progress line every tenth of the steps the long runs take in all (both sides and the
    band's two twins): how many of how many, the time so far and the time left at the pace so far."""

    def __init__(self, total: int, say: Say, clock: Callable[[], float] = time.monotonic) -> None:
        self.total, self.say, self.clock = total, say, clock
        self.every, self.count, self.started = max(1, total // 10), 0, clock()

    def step(self) -> None:
        """One more step done: a line when it ends a tenth (or the whole)."""
        self.count += 1
        if self.count % self.every and self.count != self.total:
            return
        spent = self.clock() - self.started
        left = spent / self.count * (self.total - self.count)
        self.say(f"precision-check: {self.count}/{self.total} steps at LR 0 done ({spent:.0f} s so far, "
                 f"about {left:.0f} s left)")


def _band(reference, steps: int, say: Say, progress: StepProgress) -> tuple[Band, str]:
    """The reference's noise over ``steps`` LR-0 steps (see the module's docstring)."""
    import torch

    from runmgr.precision.runner import run_long

    loose = replace(reference, training=replace(reference.training, deterministic=False))
    threads = max(1, torch.get_num_threads())
    say(f"precision-check: the noise band: the reference twice more without determinism (1 and {threads} threads)")
    first = run_long(loose, steps, threads=1, on_step=progress.step)
    second = run_long(loose, steps, threads=threads, on_step=progress.step)
    band = Band.of_twins((first.losses, second.losses), (first.grad_norms, second.grad_norms))
    widest = max(band.loss[-1], band.grad_norm[-1]) if band.loss else 0.0
    source = (f"the reference's LR-0 run twice without determinism (1 and {threads} threads): "
              + ("they agree bit for bit, band 0" if widest == 0 else
                 f"loss within {band.loss[-1]:.3e}, grad norm within {band.grad_norm[-1]:.3e}"))
    return band, source


def check_against_config(a: Side, b: Side, steps: int, conf_dir: Optional[Path] = None,
                         say: Say = _quiet) -> CheckReport:
    """Seed 004's protocol between two configs, both run here."""
    from runmgr.precision.runner import run_long, run_stages

    config_a = pinned_config(a, steps, conf_dir)
    config_b = pinned_config(b, steps, conf_dir, seed=config_a.training.seed)
    say("precision-check: steps 1 and 2 of A and B")
    stages_a, stages_b = run_stages(config_a), run_stages(config_b)
    say(f"precision-check: {steps} steps at LR 0 of A and B")
    progress = StepProgress(4 * steps, say)
    long_a, long_b = run_long(config_a, steps, on_step=progress.step), run_long(config_b, steps, on_step=progress.step)
    band, source = _band(config_a, steps, say, progress)
    verdicts = (
        compare_scalar(FORWARD, "step-1 loss", stages_a.loss_step1, stages_b.loss_step1),
        compare_local_norms(stages_a.local_norms, stages_b.local_norms),
        compare_scalar(OPTIMIZER, "step-2 loss", stages_a.loss_step2, stages_b.loss_step2),
        compare_long_run(long_a.losses, long_a.grad_norms, long_b.losses, long_b.grad_norms, band),
    )
    weights = (weights_involved(stages_a.local_norms, stages_b.local_norms, "local norm")
               + weights_involved(stages_a.updates, stages_b.updates, "update"))
    return CheckReport(a.label(), b.label(), steps, verdicts, tuple(weights),
                       tuple(dtypes_apart(stages_a.dtypes, stages_b.dtypes)), band=band, band_source=source)


def check_against_log(a: Side, log: Path, steps: Optional[int], conf_dir: Optional[Path] = None,
                      say: Say = _quiet) -> CheckReport:
    """Seed 004's protocol between a config run here and a Megatron log of the
    same pinned configuration. The long run is as long as the log's LR-0 run
    (at most ``steps`` when given)."""
    from runmgr.precision.runner import run_long, run_stages

    ref = read_megatron_log(log)
    long_steps = len(ref.long_losses) if steps is None else min(steps, len(ref.long_losses))
    config_a = pinned_config(a, max(long_steps, 2), conf_dir)
    stages = _log_stages(ref, run_stages(config_a) if ref.has_stage_run else None)
    long_verdict = StageVerdict("long-run", "loss and grad norm at LR 0", "", "", NOT_COMPARED,
                                "the log has no run at LR 0")
    band, source = Band((), ()), ""
    if long_steps:
        say(f"precision-check: {long_steps} steps at LR 0 of A")
        progress = StepProgress(3 * long_steps, say)
        long_a = run_long(config_a, long_steps, on_step=progress.step)
        band, source = _band(config_a, long_steps, say, progress)
        long_verdict = compare_long_run(long_a.losses, long_a.grad_norms, ref.long_losses[:long_steps],
                                        ref.long_grad_norms[:long_steps], band, log_precision=True)
    return CheckReport(a.label(), f"log {log}", long_steps, (*stages, long_verdict), band=band, band_source=source)


def _log_stages(ref: LogReference, run) -> tuple[StageVerdict, ...]:
    if run is None:
        return tuple(StageVerdict(stage, measure, "", "", NOT_COMPARED, "the log has no run at an LR above 0")
                     for stage, measure in ((FORWARD, "step-1 loss"), (BACKWARD, "step-1 grad norm"),
                                            (OPTIMIZER, "step-2 loss")))
    return (
        compare_scalar(FORWARD, "step-1 loss", run.loss_step1, ref.loss_step1, _loss_tolerance(ref.loss_step1)),
        _no_local_norms(compare_scalar(BACKWARD, "step-1 grad norm", run.grad_norm_step1, ref.grad_norm_step1,
                                       LOG_GRAD_NORM_TOLERANCE)),
        compare_scalar(OPTIMIZER, "step-2 loss", run.loss_step2, ref.loss_step2, _loss_tolerance(ref.loss_step2)),
    )


def _no_local_norms(verdict: StageVerdict) -> StageVerdict:
    """The backward stage against a log: the global norm only, and the table says so."""
    return replace(verdict, detail="; ".join(filter(None, (verdict.detail, "a log has no per-weight norms"))))


def _loss_tolerance(printed: Optional[float]) -> float:
    return log_loss_tolerance(printed) if printed is not None else 0.0
