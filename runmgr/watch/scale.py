"""fp16 loss-scale collapse: the scale at its floor, or too many overflows.

OPT's monitor flagged OVERFLOWING when more than 25% of the last 20 log lines
said "gradient overflow detected". Here the share is taken over the last
``window_iters`` iterations. The overflows of the scaler's initial search (a
fresh fp16 run starts at 2**32 and halves on each overflow until one step
fits) are not counted: they end at the first applied update of a sub-run.
"""

from __future__ import annotations

from collections import deque
from typing import Optional

from runmgr.config.watcher import LossScaleConfig
from runmgr.watch.incidents import LOSS_SCALE, Incident
from runmgr.watch.observations import StepObservation, onset_position


class LossScaleDetector:
    """Reports an overflow storm or a loss scale stuck at its floor, once per episode."""

    def __init__(self, config: LossScaleConfig) -> None:
        self.config = config
        self._overflows: deque[bool] = deque(maxlen=config.window_iters)
        self._searching = True
        self._dynamic = False
        self._in_episode = False
        self._previous: Optional[StepObservation] = None

    def update(self, obs: StepObservation, now: float) -> list[Incident]:
        """Feed one observation; returns a LOSS_SCALE incident when an episode starts."""
        previous = self._previous
        if previous is not None and (obs.subrun != previous.subrun or obs.step <= previous.step):
            # A restart re-runs the scaler's search and resets its state (OPT 12.17-12.34).
            self._overflows.clear()
            self._searching, self._in_episode, previous = True, False, None
        self._previous = obs
        self._count(obs)
        problem = self._problem(obs)
        if problem is None:
            self._in_episode = False
            return []
        if self._in_episode:
            return []
        self._in_episode = True
        onset_step, onset_sample, per_step = onset_position(previous, obs)
        share = sum(self._overflows) / len(self._overflows) if self._overflows else 0.0
        return [Incident(
            kind=LOSS_SCALE, time=now, subrun=obs.subrun, description=problem,
            onset_step=onset_step, peak_step=obs.step, onset_sample=onset_sample, samples_per_step=per_step,
            evidence={"loss_scale": obs.loss_scale, "min_scale": self.config.min_scale,
                      "overflow_share": share, "window_iters": len(self._overflows),
                      "max_overflow_share": self.config.max_overflow_share},
        )]

    def _count(self, obs: StepObservation) -> None:
        if obs.loss_scale is not None and obs.loss_scale > self.config.min_scale:
            self._dynamic = True  # bf16/fp32 runs report a constant 1.0 and never arm
        applied = obs.iterations - obs.skipped_iterations
        if self._searching:
            if applied <= 0:
                return
            self._searching = False
            # The line that ends the search may hold its last overflows: drop them.
            overflows = 0
        else:
            overflows = obs.skipped_iterations
        # Only the window's last iterations are kept: a line may claim any number of them (a job's
        # absurd iteration), and a list that long would not fit in memory.
        window = self._overflows.maxlen or 0
        kept_applied = min(applied, window)
        self._overflows.extend([True] * min(overflows, window - kept_applied) + [False] * kept_applied)

    def _problem(self, obs: StepObservation) -> Optional[str]:
        cfg = self.config
        if self._dynamic and obs.loss_scale is not None and obs.loss_scale <= cfg.min_scale:
            return (f"fp16 loss scale fell to {obs.loss_scale:g} at step {obs.step}, "
                    f"at or below the floor {cfg.min_scale:g}")
        if len(self._overflows) < cfg.window_iters:
            return None
        share = sum(self._overflows) / len(self._overflows)
        if share > cfg.max_overflow_share:
            return (f"{sum(self._overflows)} of the last {len(self._overflows)} iterations overflowed "
                    f"({share:.0%} > {cfg.max_overflow_share:.0%}) up to step {obs.step}, "
                    f"loss scale {obs.loss_scale}")
        return None
