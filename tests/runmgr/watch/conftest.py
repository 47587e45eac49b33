"""Recorded-like training traces for the detector tests.

A seeded, realistic pretraining process: the loss decays as a power law with
multiplicative noise and rare small bumps, the gradient norm is large early
and log-normal later with rare 1.6x excursions, step times jitter by 3% and
checkpoint steps are 50% slower. Spikes are injected on top with known onsets.
"""

from __future__ import annotations

import math
import random

import pytest

from runmgr.watch.observations import StepObservation

GLOBAL_BATCH = 128


def make_trace(steps: int, seed: int, spikes: tuple[tuple[int, int, float], ...] = (), subrun: str = "1.00",
               start: int = 1, t0: float = 1.7e9) -> list[StepObservation]:
    """``steps`` observations from step ``start``; each spike ``(onset, length, height)`` adds
    ``height`` x the baseline loss (and x5 the grad norm) over ``[onset, onset + length)``."""
    rng = random.Random(seed)
    clock = t0
    out = []
    for step in range(start, start + steps):
        base = 1.8 + 8.0 * (step + 10) ** -0.35
        loss = base * math.exp(rng.gauss(0.0, 0.015))
        if rng.random() < 0.01:
            loss *= 1.04
        grad = (0.25 + 2.0 * math.exp(-step / 100)) * math.exp(rng.gauss(0.0, 0.15))
        if rng.random() < 0.005:
            grad *= 1.6
        for onset, length, height in spikes:
            if onset <= step < onset + length:
                loss += height * base
                grad *= 5.0
        step_time = 0.5 * math.exp(rng.gauss(0.0, 0.03)) * (1.5 if step % 100 == 0 else 1.0)
        clock += step_time
        out.append(StepObservation(
            step=step, time=clock, subrun=subrun, loss=loss, grad_norm=grad, lr=1e-4, loss_scale=1.0,
            consumed_samples=step * GLOBAL_BATCH, global_batch=GLOBAL_BATCH, step_time=step_time,
            tokens_per_s=GLOBAL_BATCH * 2048 / step_time,
        ))
    return out


@pytest.fixture
def trace():
    """The trace factory: ``trace(steps, seed, spikes=((onset, length, height),))``."""
    return make_trace
