"""The report's figures against an independent computation from the logbook's
own event times and metrics rows (the issue's must-show 4)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from logbook import Logbook
from logbook.incident_costs import NO_INCIDENT
from logbook.report import run_report

from tests.logbook.conftest import FakeClock

STEP_TIME = 2.0


def train(book: Logbook, clock: FakeClock, subrun_id: str, first: int, last: int, warmup: float) -> None:
    """Steps first..last in batches of 7, the first step after ``warmup`` seconds; the
    trainer's ``time`` is when each step ended, on the logbook's clock."""
    clock.advance(warmup)
    rows = []
    for step in range(first, last + 1):
        clock.advance(STEP_TIME)
        rows.append({"step": step, "loss": 1.0 + 1.0 / step, "step_time": STEP_TIME, "time": clock.now})
        if len(rows) == 7:
            book.record_metrics(subrun_id, rows)
            rows = []
    if rows:
        book.record_metrics(subrun_id, rows)


def judged(book: Logbook, subrun_id: str, kind: str, step: int, action: str) -> int:
    incident = book.record_incident(subrun_id, kind, f"{kind} at step {step}", {}, step=step)
    book.record_decision(subrun_id, incident, action, f"{action} after {kind}", {})
    return incident


def write_recorded_run(run_dir: Path) -> None:
    """3.00 trains 1-50, an ignored slowdown, a hang at 50 (restart from 40);
    3.01 trains 41-90, loss spike at 90 (rollback to 60); 3.02 trains 61-100 and a
    person stops it; 3.03 resumes from 100 and dies before a step (worker death);
    3.04 trains 101-150, hang at 150 (restart from 120); 3.05 trains 121-160, finished."""
    clock = FakeClock()
    with Logbook.open(run_dir, clock=clock) as book:
        book.start_subrun("3.00", "launch", {}, None, 0, {}, {})
        train(book, clock, "3.00", 1, 30, warmup=5.0)
        judged(book, "3.00", "slowdown", 30, "ignore")
        train(book, clock, "3.00", 31, 50, warmup=0.0)
        judged(book, "3.00", "hang", 50, "restart")
        clock.advance(30.0)  # the hang's timeout, then the end
        book.end_subrun("3.00", "restarting", 50, "restart: hang")
        clock.advance(12.0)
        book.start_subrun("3.01", "hang at step 50", {}, str(run_dir / "checkpoints" / "step_40"), 40, {}, {})
        train(book, clock, "3.01", 41, 90, warmup=8.0)
        judged(book, "3.01", "loss_spike", 90, "rollback_skip")
        book.end_subrun("3.01", "restarting", 90, "rollback")
        clock.advance(6.0)
        book.start_subrun("3.02", "loss spike", {}, str(run_dir / "checkpoints" / "step_60"), 60, {}, {})
        train(book, clock, "3.02", 61, 100, warmup=3.0)
        clock.advance(1.0)
        book.end_subrun("3.02", "stopped", 100, "a person asked (SIGTERM)")
        clock.advance(600.0)
        book.start_subrun("3.03", "relaunch: resume", {}, str(run_dir / "checkpoints" / "step_100"), 100, {}, {})
        clock.advance(9.0)
        judged(book, "3.03", "worker_death", None, "restart")
        book.end_subrun("3.03", "restarting", None, "restart: worker death")
        clock.advance(4.0)
        book.start_subrun("3.04", "worker death", {}, str(run_dir / "checkpoints" / "step_100"), 100, {}, {})
        train(book, clock, "3.04", 101, 150, warmup=7.0)
        judged(book, "3.04", "hang", 150, "restart")
        book.end_subrun("3.04", "restarting", 150, "restart: hang")
        clock.advance(5.0)
        book.start_subrun("3.05", "hang at step 150", {}, str(run_dir / "checkpoints" / "step_120"), 120, {}, {})
        train(book, clock, "3.05", 121, 160, warmup=2.0)
        book.end_subrun("3.05", "finished", 160, None)


def independent_figures(events: list[dict], rows: list[dict]) -> dict:
    """ETTR, its series and the cost per class from the journal's times and the rows,
    by another route than logbook.accounting: a row is kept by a prefix of the lineage
    when its step is at most every later start in that prefix."""
    starts = [e for e in events if e["type"] == "subrun_start"]
    ends = {e["subrun"]: e for e in events if e["type"] == "subrun_end"}
    order = [e["subrun"] for e in starts]

    def kept_by(prefix: int) -> list[dict]:
        ids = order[:prefix]
        return [r for r in rows if r["subrun"] in ids
                and all(r["step"] <= starts[later]["start_step"] for later in range(ids.index(r["subrun"]) + 1, prefix))]

    first_start = starts[0]["time"]
    # A person's stop: the wait until the relaunch is neither wall time nor downtime.
    paused = [starts[k]["time"] - ends[order[k - 1]]["time"] if k and ends[order[k - 1]]["end_state"] == "stopped"
              else 0.0 for k in range(len(order))]
    series = [(ends[sid]["time"], sum(r["step_time"] for r in kept_by(k + 1))
               / (ends[sid]["time"] - first_start - sum(paused[:k + 1]))) for k, sid in enumerate(order)]
    classes: dict[str, dict] = {}
    for k in range(1, len(order)):
        previous, current = order[k - 1], order[k]
        decisions = [e for e in events if e["type"] == "decision" and e["subrun"] == previous and e["action"] != "ignore"]
        incident = next((e for e in events if decisions and e.get("id") == decisions[-1]["incident_id"]), None)
        entry = classes.setdefault(incident["kind"] if incident else NO_INCIDENT,
                                   {"steps_lost": 0, "redone_s": 0.0, "downtime_s": 0.0, "restart_s": 0.0})
        start = starts[k]
        reached = max([ends[previous]["last_step"] or 0] + [r["step"] for r in rows if r["subrun"] == previous])
        entry["steps_lost"] += max(0, reached - start["start_step"])
        entry["redone_s"] += sum(r["step_time"] for r in kept_by(k) if r["step"] > start["start_step"])
        entry["downtime_s"] += start["time"] - ends[previous]["time"] - paused[k]
        own = [r for r in rows if r["subrun"] == current]
        began = (min(own, key=lambda r: r["step"])["time"] - STEP_TIME) if own else ends[current]["time"]
        entry["restart_s"] += began - start["time"]
    return {"ettr": series[-1][1], "series": series, "classes": classes}


@pytest.fixture
def recorded(tmp_path: Path) -> Path:
    run_dir = tmp_path / "runs" / "three"
    write_recorded_run(run_dir)
    return run_dir


def test_ettr_and_lost_time_per_class_agree_with_the_event_times(recorded):
    with Logbook.open(recorded, create=False) as book:
        report = run_report(book)
        expected = independent_figures(book.events(), book.all_metrics())
    assert report.summary["ettr"] == pytest.approx(expected["ettr"])
    assert [t for t, _ in report.ettr_series] == [t for t, _ in expected["series"]]
    assert [e for _, e in report.ettr_series] == pytest.approx([e for _, e in expected["series"]])
    got = {cost.kind: {"steps_lost": cost.steps_lost, "redone_s": cost.redone_s, "downtime_s": cost.downtime_s,
                       "restart_s": cost.restart_s} for cost in report.costs if cost.restarts}
    assert got.keys() == expected["classes"].keys() == {"hang", "loss_spike", NO_INCIDENT, "worker_death"}
    for kind, figures in expected["classes"].items():
        assert got[kind] == pytest.approx(figures), kind


def test_costs_count_incidents_and_the_subruns_they_ended(recorded):
    with Logbook.open(recorded, create=False) as book:
        report = run_report(book)
    by_kind = {cost.kind: cost for cost in report.costs}
    assert (by_kind["hang"].incidents, by_kind["hang"].restarts) == (2, 2)
    assert (by_kind["slowdown"].incidents, by_kind["slowdown"].restarts, by_kind["slowdown"].wall_lost_s) == (1, 0, 0)
    # 3.02 was stopped by a person and relaunched 600 s later: that wait is not lost (issue 32)
    assert by_kind[NO_INCIDENT].incidents == 0 and by_kind[NO_INCIDENT].downtime_s == 0.0
    assert report.subruns[3].paused_s == 600.0 and report.summary["paused_s"] == 600.0
    # the most wall time lost first
    assert [c.wall_lost_s for c in report.costs] == sorted((c.wall_lost_s for c in report.costs), reverse=True)
    # 3.00, 3.01, 3.03 and 3.04 were ended by an incident
    assert report.mtbi_s == pytest.approx(report.summary["wall_time_s"] / 4)
    assert report.state == "finished" and report.last_incident == "hang at step 150"
    assert report.subruns[3].restart_s == pytest.approx(9.0)  # it trained nothing: its whole life
    assert report.subruns[1].lost_steps == 10 and report.subruns[1].downtime_s == 12.0


def test_to_dict_is_json_with_every_figure(recorded):
    with Logbook.open(recorded, create=False) as book:
        report = run_report(book)
    data = json.loads(json.dumps(report.to_dict()))
    assert data["run_dir"] == str(recorded) and data["name"] == "three"
    assert [s["id"] for s in data["subruns"]] == ["3.00", "3.01", "3.02", "3.03", "3.04", "3.05"]
    assert data["subruns"][1]["start_checkpoint"] == "checkpoints/step_40"
    hang = next(c for c in data["costs"] if c["kind"] == "hang")
    assert hang["wall_lost_s"] == pytest.approx(hang["redone_s"] + hang["downtime_s"] + hang["restart_s"])
    assert len(data["ettr_series"]) == 6


def test_an_open_run_is_running_and_its_empty_logbook_is_empty(tmp_path, clock):
    with Logbook.open(tmp_path / "empty", clock=clock) as book:
        assert run_report(book).state == "empty"
    with Logbook.open(tmp_path / "live", clock=clock) as book:
        book.start_subrun("1.00", "launch", {}, None, 0, {}, {})
        train(book, clock, "1.00", 1, 5, warmup=1.0)
        report = run_report(book)
    assert report.state == "running" and report.ettr_series == () and report.mtbi_s is None
    assert report.subruns[0].last_step == 5 and report.summary["ettr"] == pytest.approx(10.0 / 11.0)


def test_the_last_incident_is_the_one_behind_the_last_decision_that_acted(tmp_path, clock):
    with Logbook.open(tmp_path / "run", clock=clock) as book:
        book.start_subrun("1.00", "launch", {}, None, 0, {}, {})
        judged(book, "1.00", "loss_spike", 90, "rollback_skip")
        judged(book, "1.00", "grad_spike", 90, "ignore")  # beside it, decided already
        assert run_report(book).last_incident == "loss_spike at step 90"
    with Logbook.open(tmp_path / "quiet", clock=clock) as book:
        book.start_subrun("1.00", "launch", {}, None, 0, {}, {})
        judged(book, "1.00", "grad_spike", 12, "ignore")
        assert run_report(book).last_incident == "grad_spike at step 12"  # nothing acted: the last recorded
