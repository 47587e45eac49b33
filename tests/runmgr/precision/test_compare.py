"""Each stage's verdict, from the numbers alone (the runs are in test_check.py)."""

from __future__ import annotations

import pytest

from runmgr.precision.compare import (
    BACKWARD, CONSISTENT, DIFFERS, FORWARD, LONG_RUN, NOT_COMPARED, OPTIMIZER, SAME, Band, compare_local_norms,
    compare_long_run, compare_scalar, first_difference, log_loss_tolerance, weights_involved,
)

NO_BAND = Band((0.0,) * 4, (0.0,) * 4)


def test_two_runs_are_compared_bit_for_bit():
    assert compare_scalar(FORWARD, "step-1 loss", 5.15027285, 5.15027285).verdict == SAME
    differs = compare_scalar(FORWARD, "step-1 loss", 5.15027285, 5.15040064)
    assert differs.verdict == DIFFERS and "B - A = +1.278e-04" in differs.detail


def test_a_log_is_the_same_within_one_unit_of_its_last_printed_digit():
    assert log_loss_tolerance(5.470516) == pytest.approx(1e-6)
    assert log_loss_tolerance(0.0123456) == pytest.approx(1e-8)
    assert compare_scalar(OPTIMIZER, "step-2 loss", 5.42302322, 5.423023, log_loss_tolerance(5.423023)).verdict == SAME
    assert compare_scalar(OPTIMIZER, "step-2 loss", 5.42302322, 5.423030, log_loss_tolerance(5.42303)).verdict == DIFFERS


def test_a_missing_value_is_not_compared():
    assert compare_scalar(OPTIMIZER, "step-2 loss", 4.9, None).verdict == NOT_COMPARED


def test_the_backward_stage_compares_every_weights_local_norm():
    a = {"embedding.weight": 0.5, "final_norm.weight": 0.01}
    assert compare_local_norms(a, dict(a)).verdict == SAME
    moved = compare_local_norms(a, {**a, "final_norm.weight": 0.011})
    assert moved.verdict == DIFFERS and moved.detail == "1 of 2 weights"
    assert "one side only" in compare_local_norms(a, {"embedding.weight": 0.5}).detail


def test_the_weights_involved_are_those_that_differ_most_relatively():
    a = {"big": 10.0, "small": 0.01, "same": 1.0}
    found = weights_involved(a, {"big": 10.1, "small": 0.012, "same": 1.0}, "update")
    assert [w.name for w in found] == ["small", "big"]
    assert found[0].relative == pytest.approx(0.002 / 0.012)


def test_the_first_difference_is_the_earliest_stage_that_differs():
    stages = [compare_scalar(FORWARD, "step-1 loss", 1.0, 1.0),
              compare_local_norms({"w": 1.0}, {"w": 1.5}),
              compare_scalar(OPTIMIZER, "step-2 loss", 2.0, 2.5)]
    assert first_difference(stages).stage == BACKWARD
    assert first_difference(stages[:1]) is None


def test_a_long_run_bit_for_bit_is_the_same():
    verdict = compare_long_run([5.0, 4.9, 5.1, 5.0], [1.0] * 4, [5.0, 4.9, 5.1, 5.0], [1.0] * 4, NO_BAND)
    assert verdict.stage == LONG_RUN and verdict.verdict == SAME


def test_a_long_run_inside_the_band_and_around_zero_is_consistent():
    band = Band.of_twins(([5.0, 4.9, 5.1, 5.0], [5.002, 4.9, 5.1, 5.0]), ([1.0] * 4, [1.01] * 4))
    assert band.loss == pytest.approx((0.002, 0.002, 0.002, 0.002))  # the widest so far, at every step
    verdict = compare_long_run([5.0, 4.9, 5.1, 5.0], [1.0] * 4, [5.001, 4.899, 5.1005, 4.9995], [1.005] * 4, band)
    assert verdict.verdict == CONSISTENT


def test_a_long_run_that_leaves_the_band_differs_from_that_step():
    band = Band((0.001,) * 4, (0.01,) * 4)
    verdict = compare_long_run([5.0] * 4, [1.0] * 4, [5.0005, 4.9995, 5.01, 5.0], [1.0] * 4, band)
    assert verdict.verdict == DIFFERS and "leaves the band at step 3: loss" in verdict.detail
    by_norm = compare_long_run([5.0] * 4, [1.0] * 4, [5.0] * 4, [1.0, 1.05, 1.0, 1.0], band)
    assert "at step 2: grad norm" in by_norm.detail


def test_a_one_sided_drift_inside_the_band_is_not_noise():
    band = Band((0.01,) * 4, (0.01,) * 4)
    verdict = compare_long_run([5.0] * 4, [1.0] * 4, [5.001, 5.002, 5.003, 5.004], [1.0] * 4, band)
    assert verdict.verdict == DIFFERS and "one-sided (B above A)" in verdict.detail


def test_a_log_long_run_within_its_printing_precision_is_the_same():
    verdict = compare_long_run([5.4705162, 5.4762630], [1.09577, 1.06512], [5.470516, 5.476263], [1.096, 1.065],
                               Band((0.0, 0.0), (0.0, 0.0)), log_precision=True)
    assert verdict.verdict == SAME and verdict.detail == "as printed"
