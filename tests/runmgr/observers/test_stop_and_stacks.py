"""What the logbook writer adds for a reader: where the stacks of a hung
sub-run were dumped, and a requested stop recorded as a stop."""

from __future__ import annotations

import io

from logbook import Logbook
from logbook import cli as logbook_cli
from runmgr.controller.judgement import Judgement
from runmgr.controller.states import Launching, Restarting
from runmgr.observers.logbook_writer import LogbookObserver, record_stop
from runmgr.policy.decision import Decision
from runmgr.stacks import stacks_dir
from runmgr.watch.incidents import Incident
from trainer.plan import ResumePlan


def test_show_says_where_the_stacks_of_a_hang_are(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_dir = tmp_path / "runs" / "demo"
    with Logbook.open(run_dir) as book:
        observer = LogbookObserver(book, {})
        plan = ResumePlan(subrun="1.00")
        observer.on_transition(None, Launching("1.00", plan, 0, "launch"))
        where = stacks_dir(run_dir, "1.00")
        where.mkdir(parents=True)
        for rank in (0, 1):
            (where / f"rank{rank}.txt").write_text(f"rank {rank}\n")
        hang = Incident("hang", 1.0, "2 rank(s) silent in phase step", subrun="1.00", onset_step=48, ranks=(0, 1))
        decision = Decision("dump_and_restart", "dump every rank's stack and restart", restart_from_step=40,
                            dump_stacks=True)
        observer.on_transition(None, Restarting("1.00", plan, Judgement(hang, decision), 47))
    out = io.StringIO()
    logbook_cli.show("runs/demo", out)
    assert "stacks_dumped: stack of every rank in stacks/1.00/ (rank0.txt, rank1.txt)" in out.getvalue()
    assert (run_dir / "stacks" / "1.00" / "rank0.txt").is_file()  # the path shown, from the run directory


def test_a_requested_stop_ends_the_open_subrun_at_its_last_step(tmp_path):
    with Logbook.open(tmp_path) as book:
        book.start_subrun("1.00", "launch", {}, None, 0, {}, {})
        book.record_metrics("1.00", [{"step": step} for step in range(1, 6)])
        assert record_stop(book, "stopped by signal SIGINT") == ("1.00", 5)
        assert record_stop(book, "stopped by signal SIGINT") is None  # nothing open any more
        (subrun,) = book.lineage()
    assert (subrun.end_state, subrun.last_step, subrun.end_reason) == ("stopped", 5, "stopped by signal SIGINT")
