import math

import pytest

from logbook import Logbook, LogbookError
from logbook.curves import METRICS, curves

from tests.logbook.conftest import write_scripted_run


def test_segments_split_kept_from_thrown_away_steps(scripted_run):
    with Logbook.open(scripted_run.run_dir, create=False) as book:
        segments = curves(book, "loss")
    spans = [(s.subrun, s.kept, s.steps[0], s.steps[-1]) for s in segments]
    # 7.01 resumed from 60 (7.00's 61-67 thrown away); 7.02 from 100 (7.01's 101-120 thrown away)
    assert spans == [("7.00", True, 1, 60), ("7.00", False, 61, 67), ("7.01", True, 61, 100),
                     ("7.01", False, 101, 120), ("7.02", True, 101, 200)]
    recorded = scripted_run.recorded
    for segment in segments:
        assert list(segment.values) == [recorded[(segment.subrun, step)]["loss"] for step in segment.steps]


@pytest.mark.parametrize("max_points", [8, 40, 101])
def test_downsampling_keeps_a_one_step_spike_at_its_step(tmp_path, clock, max_points):
    with Logbook.open(tmp_path, clock=clock) as book:
        book.start_subrun("1.00", "launch", {}, None, 0, {}, {})
        rows = [{"step": s, "loss": 9.5 if s == 1234 else (math.nan if s == 2001 else 2.0 + 1.0 / s),
                 "grad_norm": 1.0} for s in range(1, 3001)]
        book.record_metrics("1.00", rows)
        book.end_subrun("1.00", "restarting", 3000, "rollback")
        book.start_subrun("1.01", "spike", {}, None, 1500, {}, {})
        book.record_metrics("1.01", [{"step": s, "loss": 1.5} for s in range(1501, 2001)])
        segments = curves(book, "loss", max_points=max_points)
    points = sum(len(s.steps) for s in segments)
    assert points <= max_points + 2 * 2 * len(segments)  # a split bucket per segment may add its two points
    first_kept, first_lost = segments[0], segments[1]
    assert (first_kept.kept, first_kept.steps[-1] <= 1500, first_lost.kept, first_lost.steps[0] > 1500) == (
        True, True, False, True)
    assert dict(zip(first_kept.steps, first_kept.values))[1234] == 9.5
    assert any(step == 2001 and math.isnan(value) for step, value in zip(first_lost.steps, first_lost.values))
    assert min(first_kept.values) == pytest.approx(2.0 + 1.0 / 1500)


def test_a_step_rerecorded_at_its_own_start_takes_the_exact_route(tmp_path, clock):
    with Logbook.open(tmp_path, clock=clock) as book:
        book.start_subrun("1.00", "launch", {}, None, 0, {}, {})
        book.record_metrics("1.00", [{"step": s, "loss": 1.0} for s in range(1, 11)])
        book.start_subrun("1.01", "again", {}, None, 5, {}, {})
        book.record_metrics("1.01", [{"step": s, "loss": 2.0} for s in range(5, 9)])  # step 5 again
        segments = curves(book, "loss")
    assert [(s.subrun, s.kept, s.steps) for s in segments] == [
        ("1.00", True, (1, 2, 3, 4)), ("1.00", False, (5, 6, 7, 8, 9, 10)), ("1.01", True, (5, 6, 7, 8))]


def test_an_unknown_metric_is_one_line(scripted_run):
    with Logbook.open(scripted_run.run_dir, create=False) as book:
        with pytest.raises(LogbookError, match="unknown metric 'perplexity': pick one of loss, grad_norm"):
            curves(book, "perplexity")
    assert "loss_scale" in METRICS
