"""fp16 loss-scale collapse: overflow share over the last 20 iterations, and the floor."""

from __future__ import annotations

from runmgr.config.watcher import LossScaleConfig
from runmgr.watch.incidents import LOSS_SCALE
from runmgr.watch.observations import StepObservation
from runmgr.watch.scale import LossScaleDetector


def fp16_steps(overflow_steps, n=200, search=16, floor_from=None):
    """Per-step observations of an fp16 run: the scaler's initial search, then overflows where asked."""
    scale, out = 2.0 ** 32, []
    for step in range(1, n + 1):
        overflow = step <= search or step in overflow_steps
        if overflow:
            scale /= 2
        if floor_from is not None and step >= floor_from:
            scale = 1.0
        out.append(StepObservation(step=step, time=float(step), loss=None if overflow else 3.0,
                                   grad_norm=float("inf") if overflow else 0.5, loss_scale=scale,
                                   consumed_samples=step * 64, skipped_iterations=int(overflow)))
    return out


def feed(detector, observations):
    return [i for obs in observations for i in detector.update(obs, obs.time)]


def test_the_initial_scale_search_is_not_an_incident():
    assert feed(LossScaleDetector(LossScaleConfig()), fp16_steps(set())) == []


def test_more_than_a_quarter_of_the_last_20_overflowing_is_an_incident():
    storm = {100, 103, 106, 109, 112, 115}  # 6 of 20 = 30%
    found = feed(LossScaleDetector(LossScaleConfig()), fp16_steps(storm))
    assert [(i.kind, i.peak_step) for i in found] == [(LOSS_SCALE, 115)]
    assert found[0].evidence["overflow_share"] == 6 / 20
    assert "6 of the last 20" in found[0].description


def test_exactly_a_quarter_is_tolerated():
    five = {100, 104, 108, 112, 116}  # 5 of 20 = 25%, not more
    assert feed(LossScaleDetector(LossScaleConfig()), fp16_steps(five)) == []


def test_the_scale_at_its_floor_is_an_incident():
    found = feed(LossScaleDetector(LossScaleConfig(min_scale=1.0)), fp16_steps(set(), floor_from=150))
    assert [(i.kind, i.onset_step) for i in found] == [(LOSS_SCALE, 150)]
    assert "floor" in found[0].description


def test_bf16_runs_with_a_constant_scale_of_one_never_fire():
    steps = [StepObservation(step=s, time=float(s), loss=3.0, grad_norm=0.5, loss_scale=1.0) for s in range(1, 300)]
    assert feed(LossScaleDetector(LossScaleConfig()), steps) == []


def test_log_lines_covering_several_iterations_count_each_overflow():
    lines = [StepObservation(step=s, time=float(s), loss=3.0, loss_scale=65536.0, iterations=10,
                             skipped_iterations=4 if s >= 100 else 0) for s in range(10, 200, 10)]
    found = feed(LossScaleDetector(LossScaleConfig()), lines)
    assert len(found) == 1 and found[0].evidence["overflow_share"] == 8 / 20


def test_a_line_claiming_2_to_the_62_iterations_keeps_only_the_window():
    # A job's line may jump to any iteration its own total allows (issue 33): the detector keeps the
    # last 20 iterations the line covers (its overflows first, then its applied steps), never a list
    # of all of them.
    steps = fp16_steps(set(), n=30)
    scale = steps[-1].loss_scale
    far = StepObservation(step=2**62, time=31.0, loss=3.0, grad_norm=0.5, loss_scale=scale,
                          iterations=2**62 - 30, skipped_iterations=2**61)
    detector = LossScaleDetector(LossScaleConfig())
    assert feed(detector, [*steps, far]) == []  # its last 20 iterations were applied ones
    storm = StepObservation(step=2**62 + 40, time=32.0, loss=None, grad_norm=float("inf"), loss_scale=scale,
                            iterations=40, skipped_iterations=40)
    (found,) = feed(detector, [storm])
    assert found.evidence["window_iters"] == 20 and found.evidence["overflow_share"] == 1.0
