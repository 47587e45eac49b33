"""NaN or Inf in the loss or in the gradients of an update that was applied.

An fp16 overflow that the loss scaler skipped is normal (the scaler's job)
and is judged by :mod:`runmgr.watch.scale`; a NaN loss, or a non-finite
gradient norm on a step that was *not* skipped (bf16/fp32), is divergence.
Reported once per episode: NaN propagates, so every later step would repeat it.
"""

from __future__ import annotations

import math
import re
from typing import Optional

from runmgr.watch.incidents import NONFINITE, Incident
from runmgr.watch.observations import StepObservation, WorkerExit, onset_position


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


_RAISED = re.compile(r"Rank (\d+), node (\S+), device (\S+), iteration (\d+): Unexpected result "
                     r"(nan|-?inf)\b(?: \(message='([^']*)'\))?", re.IGNORECASE)
"""Megatron's result validation with reruns disabled (MindSpeed-LLM's default, Megatron-LM's
before core_v0.14): a NaN/Inf loss or gradient raises this RuntimeError instead of being
printed (megatron/core/rerun_state_machine.py, validate_result)."""


class RaisedNonFiniteDetector:
    """A rank that died raising a NaN/Inf it found (Megatron's validation of the loss or of
    the gradients) diverged at that iteration: a NONFINITE incident for the ladder, with the
    stream position of the iteration when the steps seen so far tell it, not a death."""

    def __init__(self) -> None:
        self._last: Optional[StepObservation] = None

    def note_step(self, obs: StepObservation) -> None:
        """The latest step seen (where the stream stood)."""
        self._last = obs

    def update(self, exit: WorkerExit, now: float) -> Optional[list[Incident]]:
        """The incident when ``exit`` raised a non-finite result; None when it is another death."""
        found = _RAISED.search(exit.text)
        if found is None:
            return None
        rank, node, device, iteration, value, message = found.groups()
        onset = int(iteration)
        onset_sample, per_step = self._position(onset, exit.subrun)
        return [Incident(
            kind=NONFINITE, time=now, subrun=exit.subrun,
            description=f"rank {rank} on {node} (device {device}) raised an unexpected {value} at iteration "
                        f"{onset}" + (f" ({message})" if message else ""),
            onset_step=onset, peak_step=onset, onset_sample=onset_sample, samples_per_step=per_step,
            ranks=(exit.rank,) if exit.rank >= 0 else (), nodes=(exit.node,) if exit.node else (),
            evidence={"raised": found.group(0), "host": node, "device": device, "value": value},
        )]

    def _position(self, onset: int, subrun: str) -> tuple[Optional[int], Optional[int]]:
        """Where ``onset``'s batch starts in the stream, from the last step of this sub-run."""
        last = self._last
        if last is None or last.subrun != subrun or last.consumed_samples is None or last.step >= onset:
            return None, None
        per_step = last.global_batch
        if per_step is None:
            return None, None
        return last.consumed_samples + (onset - 1 - last.step) * per_step, per_step
