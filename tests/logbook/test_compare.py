"""The verdicts of logbook/compare.py on constructed series: identical, consistent,
one-sided, diverging from the step where the difference leaves the band and stays out,
and without a baseline, different from the first differing step."""

import math

import pytest

from logbook.compare import band, compare_metric, divergence_start, judge, overall, sign_test

STEPS = range(1, 41)


def loss_curve(step: int) -> float:
    return 3.0 / (1.0 + step / 7.0) + 0.5


def noisy(scale: float, shift: int = 0) -> dict[int, float]:
    """The curve plus a deterministic zero-mean wiggle of ``scale`` (its sign alternates irregularly)."""
    return {s: loss_curve(s) + scale * math.sin(1.7 * s + shift) for s in STEPS}


REFERENCE = {s: loss_curve(s) for s in STEPS}
BASELINE = (noisy(1e-4), noisy(1e-4, shift=3))


def test_the_same_series_is_identical_with_or_without_a_baseline():
    copy = dict(REFERENCE)
    assert compare_metric("loss", REFERENCE, copy).verdict.text() == "identical"
    assert compare_metric("loss", REFERENCE, copy, BASELINE).verdict.text() == "identical"


def test_without_a_baseline_a_difference_is_named_at_its_first_step():
    other = {s: v + (1e-9 if s >= 12 else 0.0) for s, v in REFERENCE.items()}
    verdict = compare_metric("loss", REFERENCE, other).verdict
    assert (verdict.kind, verdict.step, verdict.text()) == ("different", 12, "different from step 12")


def test_the_band_is_the_running_max_of_the_baseline_difference():
    c = {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0}
    d = {1: 1.0, 2: 1.5, 3: 0.9, 4: 2.0}
    assert band(c, d, [1, 2, 3, 4]) == [0.0, 0.5, 0.5, 1.0]


def test_noise_smaller_than_the_baseline_noise_is_consistent():
    judged = noisy(0.5e-4, shift=1)
    compared = compare_metric("loss", REFERENCE, judged, BASELINE)
    assert compared.verdict.text() == "consistent", compared.verdict.why
    assert not any(compared.outside()[5:])


def test_a_drift_that_leaves_the_band_diverges_from_the_step_it_leaves():
    # Noise until step 15, then a difference growing 1e-3 a step: far outside a 2e-4 band from step 16 on.
    judged = {s: v + 0.5e-4 * math.sin(1.7 * s + 1) + (1e-3 * (s - 15) if s > 15 else 0.0)
              for s, v in REFERENCE.items()}
    compared = compare_metric("loss", REFERENCE, judged, BASELINE)
    assert compared.verdict.text() == "diverging from step 16", compared.verdict.why
    assert all(compared.outside()[15:])


def test_a_stray_step_outside_the_band_is_not_a_divergence():
    judged = {s: v + 0.5e-4 * math.sin(1.7 * s + 1) + (1.0 if s == 20 else 0.0) for s, v in REFERENCE.items()}
    compared = compare_metric("loss", REFERENCE, judged, BASELINE)
    assert compared.verdict.kind == "consistent" and "1 stray step" in compared.verdict.why


def test_a_small_bias_inside_the_band_is_one_sided():
    judged = {s: v + 1e-5 + 1e-6 * math.sin(1.7 * s) for s, v in REFERENCE.items()}
    compared = compare_metric("loss", REFERENCE, judged, BASELINE)
    assert compared.verdict.kind == "one-sided" and not any(compared.outside()[2:])


def test_an_identical_baseline_pair_leaves_no_room_for_noise():
    judged = {s: v + (1e-12 if s >= 30 else 0.0) for s, v in REFERENCE.items()}
    compared = compare_metric("loss", REFERENCE, judged, (REFERENCE, dict(REFERENCE)))
    assert compared.band == (0.0,) * len(STEPS)
    assert compared.verdict.text() == "diverging from step 30"


def test_only_the_steps_every_run_has_are_compared():
    short = {s: v for s, v in REFERENCE.items() if s <= 10}
    compared = compare_metric("loss", REFERENCE, short, BASELINE)
    assert compared.steps == tuple(range(1, 11))


def test_nan_against_nan_is_equal_and_nan_against_a_number_is_outside():
    a = {1: 1.0, 2: math.nan, 3: math.nan, 4: math.nan, 5: math.nan}
    b = {1: 1.0, 2: math.nan, 3: 1.0, 4: 1.0, 5: 1.0}
    assert compare_metric("loss", a, dict(a)).verdict.kind == "identical"
    assert compare_metric("loss", a, b, (a, dict(a))).verdict.text() == "diverging from step 3"


@pytest.mark.parametrize("outside, start", [
    ([False, True, True, True], 1),
    ([True, False, False, False, False], None),      # out once, then back in
    ([False, True, True, True, False, True, True, True, True, True, True], 1),  # 9 of 10 out: stays out
    ([False, False, True, True], None),             # fewer than MIN_STEPS_OUT steps out
])
def test_divergence_start_is_the_exit_after_which_the_difference_stays_out(outside, start):
    assert divergence_start(outside) == start


def test_sign_test():
    assert sign_test(10, 10) == 1.0
    assert sign_test(0, 10) == pytest.approx(2 / 1024)
    assert sign_test(0, 0) == 1.0


def test_the_pair_verdict_is_the_most_severe_metric_verdict():
    judged = {s: v + (1e-3 * (s - 15) if s > 15 else 0.0) for s, v in REFERENCE.items()}
    calm = compare_metric("grad_norm", REFERENCE, noisy(0.5e-4, shift=1), BASELINE)
    moved = compare_metric("loss", REFERENCE, judged, BASELINE)
    verdict = overall([calm, moved])
    assert verdict.text() == "diverging from step 16" and verdict.why.startswith("loss: ")


def test_no_common_step_is_refused():
    with pytest.raises(ValueError, match="share no recorded step"):
        judge([], [], None)
