import pytest

from logbook import SubRun
from logbook.accounting import run_summary, split_metrics, subrun_costs


def subrun(index, start_step, started_at, ended_at=None, last_step=None, state=None):
    return SubRun(id=f"5.{index:02d}", index=index, started_at=started_at, cause="c", evidence={},
                  start_checkpoint=None, start_step=start_step, plan={}, config={}, ended_at=ended_at,
                  end_state=state, last_step=last_step)


def rows(subrun_id, first, last, step_time=1.0):
    return [{"subrun": subrun_id, "step": s, "step_time": step_time} for s in range(first, last + 1)]


# 5.00 trains 1..30; 5.01 resumes at 20, trains 21..50; 5.02 rolls back to 10, trains 11..60.
LINEAGE = [subrun(0, 0, 0.0, 30.0, 30, "restarting"), subrun(1, 20, 40.0, 70.0, 50, "restarting"),
           subrun(2, 10, 75.0, 125.0, 60, "finished")]
ROWS = rows("5.00", 1, 30) + rows("5.01", 21, 50) + rows("5.02", 11, 60)


def test_kept_metrics_follow_the_surviving_lineage():
    kept, superseded = split_metrics(LINEAGE, ROWS)
    assert [r["step"] for r in kept] == list(range(1, 61))
    origin = {r["step"]: r["subrun"] for r in kept}
    assert {origin[s] for s in range(1, 11)} == {"5.00"}
    assert {origin[s] for s in range(11, 61)} == {"5.02"}
    assert len(superseded) == len(ROWS) - len(kept) == 50  # trained minus kept


def test_lost_steps_sum_to_steps_trained_minus_steps_kept():
    costs = subrun_costs(LINEAGE, ROWS, last_activity={})
    assert [costs[s.id].lost_steps for s in LINEAGE] == [0, 10, 40]
    assert costs["5.02"].lost_step_time == 40.0  # 11..20 of 5.00 and 21..50 of 5.01
    assert [costs[s.id].downtime for s in LINEAGE] == [0.0, 10.0, 5.0]
    assert sum(c.lost_steps for c in costs.values()) == len(ROWS) - 60


def test_a_subrun_that_trained_nothing_loses_nothing_for_the_next():
    lineage = [subrun(0, 0, 0.0, 5.0, None, "failed"), subrun(1, 0, 6.0)]
    assert subrun_costs(lineage, [], {})["5.01"].lost_steps == 0


def test_open_subrun_downtime_counts_from_its_last_record():
    lineage = [subrun(0, 0, 0.0), subrun(1, 0, 100.0)]
    assert subrun_costs(lineage, [], {"5.00": 60.0})["5.01"].downtime == 40.0


def test_ettr_is_kept_step_time_over_wall_time():
    summary = run_summary(LINEAGE, ROWS, ["worker_lost", "loss_spike", "loss_spike"], 4, 125.0)
    assert summary["steps_kept"] == 60 and summary["steps_lost"] == 50
    assert summary["wall_time_s"] == 125.0 and summary["kept_time_s"] == 60.0
    assert summary["ettr"] == pytest.approx(60.0 / 125.0)
    assert summary["incidents"] == {"worker_lost": 1, "loss_spike": 2}
    assert summary["last_state"] == "finished" and summary["last_step"] == 60


def test_a_stop_by_a_person_is_not_costed_with_the_wait_for_its_relaunch():
    """Issue 32: a Ctrl-C at 30 s and a relaunch the next morning counted the night as lost."""
    lineage = [subrun(0, 0, 0.0, 30.0, 30, "stopped"), subrun(1, 30, 36_030.0, 36_060.0, 60, "finished")]
    steps = rows("5.00", 1, 30) + rows("5.01", 31, 60)
    costs = subrun_costs(lineage, steps, last_activity={})
    assert costs["5.01"].downtime == 0.0 and costs["5.01"].paused == 36_000.0
    summary = run_summary(lineage, steps, [], 2, 36_060.0)
    assert summary["wall_time_s"] == 60.0 and summary["paused_s"] == 36_000.0
    assert summary["ettr"] == pytest.approx(1.0) and summary["lost_time_s"] == 0.0


def test_open_run_wall_time_ends_at_the_last_record_not_at_reading_time():
    lineage = [subrun(0, 0, 0.0)]
    summary = run_summary(lineage, rows("5.00", 1, 10), [], 0, last_record_time=20.0)
    assert summary["wall_time_s"] == 20.0 and summary["ettr"] == 0.5
    assert summary["last_state"] is None


def test_empty_logbook_summary_has_no_ettr():
    summary = run_summary([], [], [], 0, None)
    assert summary["subruns"] == 0 and summary["ettr"] is None and summary["wall_time_s"] == 0.0


def test_the_range_route_agrees_with_the_row_walk_on_random_lineages():
    import random

    from logbook.accounting import (RangeTotals, ledger, needs_rows, step_stats, superseded_from_ranges,
                                    superseded_from_rows)

    generator = random.Random(7)
    for _ in range(200):
        lineage, all_rows, start, clock = [], [], 0, 0.0
        for index in range(generator.randint(1, 6)):
            reached = start + generator.randint(0, 30)
            sid = f"5.{index:02d}"
            lineage.append(subrun(index, start, clock, clock + 50.0, reached, "restarting"))
            all_rows += [{"subrun": sid, "step": s, "step_time": generator.choice([0.5, 1.0, 2.0]),
                          "time": clock + s} for s in range(start + 1, reached + 1)]
            start, clock = generator.randint(0, reached), clock + 60.0

        def read_range(sid, above, up_to, rows=all_rows):
            inside = [r for r in rows if r["subrun"] == sid and (above is None or r["step"] > above)
                      and (up_to is None or r["step"] <= up_to)]
            return RangeTotals(len(inside), sum(r["step_time"] for r in inside),
                               max((r["step"] for r in inside), default=None))

        stats = step_stats(all_rows)
        assert not needs_rows(lineage, stats)
        walked = ledger(lineage, stats, superseded_from_rows(lineage, all_rows), {})
        ranged = ledger(lineage, stats, superseded_from_ranges(lineage, stats, read_range), {})
        assert (ranged.steps_kept, ranged.last_kept_step, ranged.costs) == (
            walked.steps_kept, walked.last_kept_step, walked.costs)
        assert ranged.kept_time == pytest.approx(walked.kept_time)
        assert [t for t, _ in ranged.ettr_series] == [t for t, _ in walked.ettr_series]
        assert [e for _, e in ranged.ettr_series] == pytest.approx([e for _, e in walked.ettr_series])
