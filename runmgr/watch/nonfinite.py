"""NaN or Inf in the loss or in the gradients of an update that was applied.

An fp16 overflow that the loss scaler skipped is normal (the scaler's job)
and is judged by :mod:`runmgr.watch.scale`; a NaN loss, or a non-finite
gradient norm on a step that was *not* skipped (bf16/fp32), is divergence.
Reported once per episode: NaN propagates, so every later step would repeat it.
"""

from __future__ import annotations

import math
from typing import Optional

from runmgr.watch.incidents import NONFINITE, Incident
from runmgr.watch.observations import StepObservation, onset_position


class NonFiniteDetector:
    """Reports the first non-finite loss or applied gradient of an episode."""

    def __init__(self) -> None:
        self._armed = True
        self._previous: Optional[StepObservation] = None

    def update(self, obs: StepObservation, now: float) -> list[Incident]:
        """Feed one observation; returns a NONFINITE incident at the start of an episode."""
        previous = self._previous
        if previous is not None and (obs.subrun != previous.subrun or obs.step <= previous.step):
            self._armed, previous = True, None
        self._previous = obs
        signs = _non_finite_signs(obs)
        if not signs:
            self._armed = True
            return []
        if not self._armed:
            return []
        self._armed = False
        onset_step, onset_sample, per_step = onset_position(previous, obs)
        return [Incident(
            kind=NONFINITE, time=now, subrun=obs.subrun,
            description=f"{' and '.join(signs)} at step {obs.step}",
            onset_step=onset_step, peak_step=obs.step, onset_sample=onset_sample, samples_per_step=per_step,
            evidence={"loss": obs.loss, "grad_norm": obs.grad_norm, "nan_iterations": obs.nan_iterations,
                      "iterations": obs.iterations, "skipped_iterations": obs.skipped_iterations},
        )]


def _non_finite_signs(obs: StepObservation) -> list[str]:
    signs = []
    if obs.loss is not None and not math.isfinite(obs.loss):
        signs.append(f"loss is {obs.loss}")
    if obs.grad_norm is not None and not math.isfinite(obs.grad_norm) and obs.skipped_iterations == 0:
        signs.append(f"grad norm is {obs.grad_norm} on an applied update")
    if obs.nan_iterations > 0:
        signs.append(f"{obs.nan_iterations} of {obs.iterations} iteration(s) had a NaN loss")
    return signs
