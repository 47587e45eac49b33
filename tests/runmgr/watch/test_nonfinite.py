"""NaN/Inf in the loss or in an applied update."""

from __future__ import annotations

import dataclasses
import math

from runmgr.watch.incidents import NONFINITE
from runmgr.watch.nonfinite import NonFiniteDetector


def feed(detector, observations):
    return [i for obs in observations for i in detector.update(obs, obs.time)]


def test_nan_loss_is_reported_once_per_episode_with_its_position(trace):
    observations = trace(300, 1)
    broken = [dataclasses.replace(o, loss=math.nan) if 200 <= o.step < 220 else o for o in observations]
    found = feed(NonFiniteDetector(), broken)
    assert [(i.kind, i.onset_step) for i in found] == [(NONFINITE, 200)]
    assert found[0].onset_sample == 199 * 128
    assert "loss is nan" in found[0].description


def test_a_new_episode_after_finite_steps_is_reported_again(trace):
    observations = trace(300, 2)
    broken = [dataclasses.replace(o, loss=math.inf) if o.step in (100, 250) else o for o in observations]
    assert [i.onset_step for i in feed(NonFiniteDetector(), broken)] == [100, 250]


def test_inf_grad_norm_of_an_fp16_skipped_step_is_not_divergence(trace):
    observations = trace(100, 3)
    skipped = [dataclasses.replace(o, grad_norm=math.inf, skipped_iterations=1) if o.step == 50 else o
               for o in observations]
    assert feed(NonFiniteDetector(), skipped) == []


def test_nan_grad_norm_of_an_applied_update_is_divergence(trace):
    observations = trace(100, 4)
    applied = [dataclasses.replace(o, grad_norm=math.nan) if o.step == 60 else o for o in observations]
    assert [i.onset_step for i in feed(NonFiniteDetector(), applied)] == [60]


def test_megatron_nan_iteration_count_is_divergence(trace):
    observations = trace(100, 5)
    counted = [dataclasses.replace(o, loss=None, nan_iterations=1) if o.step == 70 else o for o in observations]
    found = feed(NonFiniteDetector(), counted)
    assert [i.onset_step for i in found] == [70] and "NaN loss" in found[0].description
