"""Which weights moved first and most: seed 004's local norms, read against each
weight's own recent past."""

from __future__ import annotations

import math

import pytest

from logbook.local_norms import analyse


def steady(steps, **jumps) -> dict[int, dict[str, float]]:
    """Norms of three weights that wobble around 1, 2 and 0.5; ``jumps``: name=(step, factor)
    multiplies that weight's norm from that step on."""
    series = {}
    for step in steps:
        wobble = 1.0 + 0.05 * ((step * 7) % 5 - 2)
        norms = {"embedding.weight": 1.0 * wobble, "layers.0.mlp.w1.weight": 2.0 * wobble, "output.weight": 0.5 * wobble}
        for name, (at, factor) in jumps.items():
            if step >= at:
                norms[name.replace("__", ".")] *= factor
        series[step] = norms
    return series


def test_the_weight_that_jumps_first_and_the_one_that_jumps_most_are_named():
    series = steady(range(1, 31), output__weight=(20, 6.0), embedding__weight=(21, 40.0))
    moves = analyse(series, 20, threshold=3.0)
    assert moves.first_step == 20
    assert [w.name for w in moves.first] == ["output.weight"]
    assert moves.first[0].first_ratio == pytest.approx(6.0, rel=0.15)
    assert moves.most[0].name == "embedding.weight" and moves.most[0].peak_ratio == pytest.approx(40.0, rel=0.15)
    mlp = next(w for w in moves.weights if w.name == "layers.0.mlp.w1.weight")
    assert mlp.first_step is None and mlp.peak_ratio < 1.2  # it never moved
    assert moves.baseline_steps == tuple(range(10, 20)) and moves.examined_steps == tuple(range(20, 31))
    evidence = moves.evidence()
    assert evidence["first"] == [{"name": "output.weight", "ratio": moves.first[0].first_ratio}]
    assert evidence["most"][0]["name"] == "embedding.weight" and evidence["first_step"] == 20


def test_the_first_move_may_come_after_the_step_asked_about():
    series = steady(range(1, 31), layers__0__mlp__w1__weight=(24, 5.0))
    moves = analyse(series, 20)
    assert moves.first_step == 24 and [w.name for w in moves.first] == ["layers.0.mlp.w1.weight"]


def test_a_higher_threshold_names_fewer_weights_and_an_outlier_in_the_window_does_not_move_the_baseline():
    series = steady(range(1, 31), output__weight=(20, 6.0))
    series[15]["output.weight"] = 100.0  # one wild value inside the baseline window: the median ignores it
    assert [w.name for w in analyse(series, 20, threshold=3.0).first] == ["output.weight"]
    assert analyse(series, 20, threshold=10.0).first_step is None


def test_only_recorded_steps_count_and_an_overflow_is_an_infinite_ratio():
    series = {step: {"w": 1.0} for step in range(100, 1100, 100)}  # every 100th step
    series[1000] = {"w": math.inf}
    moves = analyse(series, 1000, window=5)
    assert moves.baseline_steps == (500, 600, 700, 800, 900)
    assert moves.first_step == 1000 and math.isinf(moves.first[0].first_ratio)


def test_nothing_to_say_without_norms_before_the_step_or_from_it():
    series = steady(range(10, 21))
    assert analyse(series, 10) is None  # nothing before
    assert analyse(series, 25) is None  # nothing at or after
    assert analyse(series, 15, until=14) is None
