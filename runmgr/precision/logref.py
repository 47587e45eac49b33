"""A Megatron-LM / MindSpeed-LLM training log as the other side of the check.

The log is read with the watcher's own Megatron log reader
(runmgr/watch/megatron_log.py), so every variant it reads (stamps, rank
prefixes, ``(s)`` times...) works here. It must print every iteration
(``--log-interval 1``) and may hold one or both of seed 004's runs of the
pinned configuration, one after the other (an iteration number going back
starts the next): a **stage run** at the pinned, constant LR (iterations 1
and 2 give the forward, backward and optimizer stages: the log has no
per-weight norms, so the backward stage compares iteration 1's global grad
norm) and a **long run** at LR 0 (every iteration's loss and grad norm).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from runmgr.errors import UserError
from runmgr.watch.megatron_log import MegatronLogReader
from runmgr.watch.observations import StepObservation


@dataclass(frozen=True)
class LogReference:
    """What the log holds for each stage (None / empty: not in the log)."""

    path: Path
    loss_step1: Optional[float] = None
    grad_norm_step1: Optional[float] = None
    loss_step2: Optional[float] = None
    long_losses: tuple[float, ...] = ()
    long_grad_norms: tuple[float, ...] = ()

    @property
    def has_stage_run(self) -> bool:
        return self.loss_step1 is not None


def _runs(path: Path) -> list[list[StepObservation]]:
    try:
        with path.open(encoding="utf-8", errors="replace") as lines:
            steps = [event for event in MegatronLogReader().events(lines) if isinstance(event, StepObservation)]
    except OSError as exc:
        raise UserError(f"cannot read the Megatron log {path}: {exc.strerror or exc}") from None
    runs: dict[str, list[StepObservation]] = {}
    for step in steps:
        runs.setdefault(step.subrun, []).append(step)
    return list(runs.values())


def _check_run(path: Path, run: list[StepObservation]) -> None:
    coarse = next((step for step in run if step.iterations != 1), None)
    if coarse is not None:
        raise UserError(f"{path}: iteration {coarse.step} covers {coarse.iterations} iterations: the check needs "
                        f"every iteration's values; run the job with --log-interval 1")
    if run[0].step != 1:
        raise UserError(f"{path}: a run in the log starts at iteration {run[0].step}, not 1 (resumed?): the check "
                        f"compares runs from the initial weights")
    unreported = next((step for step in run if step.loss is None or step.grad_norm is None), None)
    if unreported is not None:
        raise UserError(f"{path}: iteration {unreported.step} prints no lm loss or grad norm (a skipped or NaN "
                        f"iteration): the pinned run must have none")


def read_megatron_log(path: Path) -> LogReference:
    """The stage run and the LR-0 run of the log at ``path``; one line
    (:class:`UserError`) when it holds neither or something the check cannot use."""
    runs = _runs(path)
    if not runs:
        raise UserError(f"{path} holds no Megatron iteration line (`iteration N/ M | ... lm loss: ... |`): "
                        f"give the training log of the job")
    stage_runs, long_runs = [], []
    for run in runs:
        _check_run(path, run)
        (long_runs if run[0].lr == 0 else stage_runs).append(run)
    if len(stage_runs) > 1 or len(long_runs) > 1:
        raise UserError(f"{path} holds {len(stage_runs)} runs at an LR above 0 and {len(long_runs)} at LR 0: give "
                        f"at most one of each (the stage run, then the LR-0 run)")
    out = LogReference(path)
    if stage_runs:
        run = stage_runs[0]
        out = LogReference(path, run[0].loss, run[0].grad_norm, run[1].loss if len(run) > 1 else None)
    if long_runs:
        run = long_runs[0]
        out = LogReference(path, out.loss_step1, out.grad_norm_step1, out.loss_step2,
                           tuple(float(step.loss) for step in run), tuple(float(step.grad_norm) for step in run))
    return out
