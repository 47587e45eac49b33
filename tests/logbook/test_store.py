import math
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from logbook import LOGBOOK_FILENAME, Logbook, LogbookError


def start(book, run_number=1, start_step=0, checkpoint=None, config=None, cause="launch"):
    subrun_id = book.next_subrun_id(run_number)
    book.start_subrun(subrun_id, cause, {}, checkpoint, start_step, {}, config or {"seed": 1})
    return subrun_id


def test_lineage_is_numbered_in_order(tmp_path, clock):
    with Logbook.open(tmp_path / "run", clock=clock) as book:
        assert book.next_subrun_id(12) == "12.00"
        ids = []
        for _ in range(3):
            ids.append(start(book, 12))
            book.end_subrun(ids[-1], "restarting", 0, "test")
        assert ids == ["12.00", "12.01", "12.02"]
        assert [s.index for s in book.lineage()] == [0, 1, 2]


def test_start_out_of_order_or_for_another_run_is_refused(tmp_path, clock):
    with Logbook.open(tmp_path, clock=clock) as book:
        with pytest.raises(LogbookError, match="the next one is 3.00"):
            book.start_subrun("3.01", "launch", {}, None, 0, {}, {})
        start(book, 3)
        with pytest.raises(LogbookError, match="holds run 3, not run 4"):
            book.start_subrun("4.00", "launch", {}, None, 0, {}, {})
        with pytest.raises(LogbookError, match="no sub-run '3.05'"):
            book.record_event("3.05", "note", "hello")


def test_scripted_lineage_reads_back(scripted_run):
    with Logbook.open(scripted_run.run_dir) as book:
        first, second, third = book.lineage()
    assert (first.cause, first.start_step, first.start_checkpoint) == ("launch", 0, None)
    assert (first.end_state, first.last_step, first.end_reason) == ("restarting", 67, "worker lost")
    assert second.evidence["pid"] == 4242 and second.start_checkpoint == "checkpoints/step_00000060"
    assert third.plan["skip_ranges"] == [[3200, 3328]]
    assert (third.end_state, third.last_step) == ("finished", 200)


def test_config_diff_is_taken_against_the_previous_subrun(scripted_run):
    with Logbook.open(scripted_run.run_dir) as book:
        diffs = [s.config_diff for s in book.lineage()]
    assert diffs == [{}, {}, {"optim.lr": [3e-4, 1.5e-4]}]


def test_kept_metrics_drop_the_steps_that_were_rolled_back(scripted_run):
    with Logbook.open(scripted_run.run_dir) as book:
        kept, every = book.kept_metrics(), book.all_metrics()
        lost = [book.lost_steps(s.id) for s in book.lineage()]
    assert [row["step"] for row in kept] == list(range(1, 201))
    owner = {row["step"]: row["subrun"] for row in kept}
    assert owner[60] == "7.00" and owner[61] == owner[100] == "7.01" and owner[101] == "7.02"
    assert lost == [0, 7, 20]
    assert len(every) == len(scripted_run.recorded) == 67 + 60 + 100
    assert len(every) - len(kept) == sum(lost)


def test_rerecording_a_step_does_not_duplicate_it(tmp_path, clock):
    with Logbook.open(tmp_path, clock=clock) as book:
        subrun_id = start(book)
        assert book.record_metrics(subrun_id, [{"step": s, "loss": 2.0} for s in (1, 2, 3)]) == 3
        assert book.record_metrics(subrun_id, [{"step": s, "loss": 9.0} for s in (3, 4)]) == 1
        rows = book.all_metrics()
    assert [(r["step"], r["loss"]) for r in rows] == [(1, 2.0), (2, 2.0), (3, 2.0), (4, 9.0)]


def test_summary_figures_match_the_script(scripted_run):
    with Logbook.open(scripted_run.run_dir) as book:
        summary = book.summary()
        started = book.lineage()[0].started_at
    assert summary["subruns"] == 3 and summary["last_state"] == "finished"
    assert summary["steps_kept"] == 200 and summary["steps_lost"] == 27
    assert summary["incidents"] == {"worker_lost": 1, "loss_spike": 1}
    assert summary["checkpoints"] == 3 + 3 + 5
    assert summary["wall_time_s"] == scripted_run.clock.now - started
    assert summary["ettr"] == pytest.approx(200 * 0.5 / summary["wall_time_s"])


def test_events_are_in_order_with_their_types(scripted_run):
    with Logbook.open(scripted_run.run_dir) as book:
        events = book.events()
    types = [e["type"] for e in events if e["type"] != "checkpoint"]
    assert types == ["subrun_start", "incident", "decision", "subrun_end",
                     "subrun_start", "incident", "decision", "subrun_end",
                     "subrun_start", "event", "subrun_end"]
    times = [e["time"] for e in events]
    assert times == sorted(times)
    decision = next(e for e in events if e["type"] == "decision" and e["subrun"] == "7.01")
    assert decision["incident_id"] == scripted_run.incident_ids[1]
    assert decision["plan"]["lr_scale"] == 0.5


def test_a_second_end_and_bad_payloads_are_refused(tmp_path, clock):
    with Logbook.open(tmp_path, clock=clock) as book:
        subrun_id = start(book)
        with pytest.raises(LogbookError, match="plain JSON"):
            book.record_event(subrun_id, "note", "x", {"when": object()})
        with pytest.raises(LogbookError, match="no incident 99"):
            book.record_decision(subrun_id, 99, "restart", "r", {})
        book.end_subrun(subrun_id, "finished", 0, None)
        with pytest.raises(LogbookError, match="already ended"):
            book.end_subrun(subrun_id, "failed", 0, None)
        with pytest.raises(LogbookError, match="lowercase word"):
            book.end_subrun(subrun_id, "Done!", 0, None)


def test_a_subrun_left_open_is_ended_as_abandoned_at_its_last_record(tmp_path, clock):
    with Logbook.open(tmp_path, clock=clock) as book:
        first = start(book)
        clock.advance(5.0)
        book.record_metrics(first, [{"step": 1}, {"step": 2}])
        last_seen = clock.now
    clock.advance(100.0)  # the driver died; relaunched later
    with Logbook.open(tmp_path, clock=clock) as book:
        second = start(book, start_step=0)
        previous, current = book.lineage()
        costs = book.costs()
    assert (previous.end_state, previous.last_step, previous.ended_at) == ("abandoned", 2, last_seen)
    assert current.id == second and current.is_open
    assert costs[second].downtime == 100.0 and costs[second].lost_steps == 2


def test_a_reader_sees_what_a_live_writer_committed(tmp_path, clock):
    with Logbook.open(tmp_path, clock=clock) as writer:
        subrun_id = start(writer)
        writer.record_metrics(subrun_id, [{"step": 1, "loss": 1.5}])
        with Logbook.open(tmp_path, create=False) as reader:
            assert [r["loss"] for r in reader.all_metrics()] == [1.5]


def test_a_copied_run_directory_opens_elsewhere(scripted_run, tmp_path):
    copy = tmp_path / "elsewhere" / "seven-copy"
    shutil.copytree(scripted_run.run_dir, copy)
    shutil.rmtree(scripted_run.run_dir)
    with Logbook.open(copy, create=False) as book:
        second = book.lineage()[1]
        assert book.resolve(second.start_checkpoint) == copy / "checkpoints" / "step_00000060"
        assert len(book.kept_metrics()) == 200


def test_nan_loss_is_recorded_as_nan(tmp_path, clock):
    with Logbook.open(tmp_path, clock=clock) as book:
        subrun_id = start(book)
        book.record_metrics(subrun_id, [{"step": 1, "loss": math.nan, "grad_norm": math.inf}])
        row = book.all_metrics()[0]
    assert math.isnan(row["loss"]) and row["grad_norm"] == math.inf


CHILD = r"""
import sys
from logbook import Logbook
book = Logbook.open(sys.argv[1])
subrun = book.next_subrun_id(3)
book.start_subrun(subrun, "launch", {}, None, 0, {}, {"seed": 1})
print("S", subrun, flush=True)
step = 0
while True:
    step += 1
    book.record_metrics(subrun, [{"step": step, "loss": 1.0 / step}])
    print("M", subrun, step, flush=True)
    seq = book.record_event(subrun, "tick", f"step {step}", {"step": step}, step=step)
    print("E", subrun, seq, flush=True)
"""


def run_and_kill(run_dir: Path, lines_before_kill: int) -> list[list[str]]:
    """Run the writer child, SIGKILL it after some lines; return every line it printed."""
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(run_dir)], stdout=subprocess.PIPE, text=True)
    seen = [child.stdout.readline().split() for _ in range(lines_before_kill)]
    child.send_signal(signal.SIGKILL)
    rest, _ = child.communicate(timeout=10)
    assert child.returncode == -signal.SIGKILL
    return seen + [line.split() for line in rest.splitlines()]


def test_sigkill_at_a_random_moment_loses_nothing_committed(tmp_path):
    rng = random.Random()
    run_dir = tmp_path / "crashy"
    for trial in range(3):
        reported = run_and_kill(run_dir, rng.randint(3, 120))
        subrun_id = f"3.{trial:02d}"
        assert reported[0] == ["S", subrun_id]
        with Logbook.open(run_dir, create=False) as book:
            steps = {r["step"] for r in book.all_metrics() if r["subrun"] == subrun_id}
            seqs = {e["seq"] for e in book.events() if e["subrun"] == subrun_id}
        assert {int(l[2]) for l in reported if l[0] == "M"} <= steps
        assert {int(l[2]) for l in reported if l[0] == "E"} <= seqs
    connection = sqlite3.connect(run_dir / LOGBOOK_FILENAME)
    assert connection.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    connection.close()
    with Logbook.open(run_dir) as book:
        states = [s.end_state for s in book.lineage()]
    assert states == ["abandoned", "abandoned", None]  # each relaunch closed its killed predecessor


def test_a_reader_sees_each_record_whole_while_the_driver_writes(tmp_path, clock, monkeypatch):
    # A live run's logbook is read (runmgr logbook events, a test, the metrics exporter)
    # while the driver appends. The reader fetches the details tables, then the journal:
    # the driver commits an event between the two, exactly there.
    from logbook import queries

    with Logbook.open(tmp_path, clock=clock) as driver, Logbook.open(tmp_path, clock=clock, create=False) as reader:
        subrun = start(driver)
        driver.record_event(subrun, "note", "before")
        fetch_details = queries._by_seq
        written = []

        def details_then_a_write(*args):
            found = fetch_details(*args)
            if not written:
                written.append(driver.record_event(subrun, "note", "meanwhile"))
            return found

        monkeypatch.setattr(queries, "_by_seq", details_then_a_write)
        seen = [e.get("message") for e in reader.events() if e["type"] == "event"]
        assert written and seen == ["before"]  # the snapshot predates the write
        monkeypatch.undo()
        assert [e.get("message") for e in reader.events() if e["type"] == "event"] == ["before", "meanwhile"]


def test_a_number_no_column_holds_never_raises_and_never_costs_the_other_rows(tmp_path, clock):
    # The last line of defence behind the readers (issue 33): whatever a job's numbers became.
    with Logbook.open(tmp_path, clock=clock) as book:
        subrun_id = start(book)
        rows = [{"step": 1, "loss": 2.0, "consumed_samples": 8},
                {"step": 10**5000, "loss": 2.0}, {"step": math.nan}, {"step": -math.inf}, {"step": 2**64},
                {"step": 3, "consumed_samples": 10**30, "tokens": math.nan, "loss": 10**400},
                {"step": 4, "consumed_samples": -(2**70), "tokens": math.inf, "peak_memory_bytes": 1e300},
                {"step": 5, "consumed_samples": 2**63 - 1}]
        assert book.record_metrics(subrun_id, rows) == 4
        book.record_metrics(subrun_id, [{"step": 6, "consumed_samples": 2**64}, {"step": 2**65}])
        kept = {row["step"]: row for row in book.all_metrics()}
        assert sorted(kept) == [1, 3, 4, 5, 6]
        assert kept[1]["consumed_samples"] == 8 and kept[5]["consumed_samples"] == 2**63 - 1
        assert kept[3]["consumed_samples"] is None and kept[3]["tokens"] is None and kept[3]["loss"] == math.inf
        assert kept[4]["consumed_samples"] is None and kept[4]["peak_memory_bytes"] is None
        noted = [e for e in book.events() if e["type"] == "event" and e["kind"] == "metrics_out_of_range"]
        # Said once per field of the sub-run, however often it comes.
        assert sorted(e["data"]["field"] for e in noted) == ["consumed_samples", "peak_memory_bytes", "step", "tokens"]
        step_note = next(e["message"] for e in noted if e["data"]["field"] == "step")
        assert "step ~10^" in step_note and "left out" in step_note and len(step_note) < 300  # not 5000 digits


def test_an_event_incident_or_end_at_a_step_no_column_holds_is_kept_without_its_step(tmp_path, clock):
    with Logbook.open(tmp_path, clock=clock) as book:
        subrun_id = start(book)
        book.record_event(subrun_id, "note", "far", step=2**64)
        book.record_incident(subrun_id, "loss_spike", "far", {}, step=-(2**64))
        book.end_subrun(subrun_id, "finished", 2**70, "done")
        note = next(e for e in book.events() if e["type"] == "event" and e["kind"] == "note")
        assert note["step"] is None and book.lineage()[-1].last_step is None


def test_a_run_s_logbook_waits_for_the_disk_and_a_scratch_one_does_not(tmp_path):
    # A run's every write is on disk before it returns (crash safety); watch score's throwaway
    # logbooks skip that wait (a corpus scored three times faster), and read back the same.
    with Logbook.open(tmp_path / "run") as book:
        assert book._connection.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    with Logbook.open(tmp_path / "scratch", scratch=True) as book:
        assert book._connection.execute("PRAGMA synchronous").fetchone()[0] == 0  # OFF
        book.start_subrun("1.00", "launch", {}, None, 0, {}, {})
        book.record_event("1.00", "note", "kept", {})
        assert [e["message"] for e in book.events() if e["type"] == "event"] == ["kept"]
