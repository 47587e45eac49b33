"""Salvage keeps what can be read and leaves out what would no longer hold
together: with the incidents' page garbled, the decisions about them and
their journal entries go too, everything else stays, and the chronicle reads."""

from __future__ import annotations

import io
import random
import sqlite3

import pytest

from logbook import LOGBOOK_FILENAME, Logbook, LogbookError
from logbook.cli import events_jsonl, show
from logbook.salvage import salvage


def garble_page_of(path, table: str) -> None:
    """Random bytes over the page that holds ``table`` (a small table: its root is its only page)."""
    connection = sqlite3.connect(path)
    (root,) = connection.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()
    page_size = connection.execute("PRAGMA page_size").fetchone()[0]
    connection.close()
    with open(path, "r+b") as f:
        f.seek((root - 1) * page_size)
        f.write(random.Random(3).randbytes(page_size))


def test_rows_orphaned_by_a_lost_page_are_left_out_and_the_rest_reads(scripted_run):
    run_dir = scripted_run.run_dir
    with Logbook.open(run_dir) as book:
        before = book.events()
        metrics = book.all_metrics()
    garble_page_of(run_dir / LOGBOOK_FILENAME, "incidents")
    with pytest.raises(LogbookError, match="is damaged .*logbook salvage"):
        Logbook.open(run_dir, create=False)

    report = salvage(run_dir)

    counts = {t.table: t for t in report.tables}
    assert counts["incidents"].kept == 0 and counts["decisions"].read == 2 and counts["decisions"].kept == 0
    assert counts["metrics"].kept == len(metrics) and counts["subrun_starts"].kept == 3
    out = io.StringIO()
    assert show(run_dir, out) == 0 and "7.02" in out.getvalue()
    events_jsonl(run_dir, out := io.StringIO())
    after = out.getvalue().splitlines()
    expected = [e for e in before if e["type"] not in ("incident", "decision")]
    assert len(after) == len(expected)
    with Logbook.open(run_dir, create=False) as book:
        assert book.all_metrics() == metrics
    assert report.damaged_copy.is_file() and report.damaged_copy.parent == run_dir


def test_a_healthy_logbook_is_not_salvaged(scripted_run):
    with pytest.raises(LogbookError, match="not damaged: nothing to salvage"):
        salvage(scripted_run.run_dir)
    assert sorted(p.name for p in scripted_run.run_dir.iterdir()) == [LOGBOOK_FILENAME]
