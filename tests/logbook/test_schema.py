import math
import re
import sqlite3
from pathlib import Path

import pytest

import logbook.norms_queries
import logbook.queries
import logbook.store
from logbook import LOGBOOK_FILENAME, SCHEMA_VERSION, Logbook, LogbookError


def test_file_is_wal_with_full_sync_and_versioned(tmp_path, clock):
    with Logbook.open(tmp_path, clock=clock) as book:
        connection = book._connection
        assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert connection.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert connection.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] == SCHEMA_VERSION


@pytest.mark.parametrize("statement", [
    "UPDATE metrics SET loss = 0.0",
    "DELETE FROM metrics",
    "UPDATE subrun_ends SET end_state = 'finished'",
    "DELETE FROM journal",
    "INSERT OR REPLACE INTO metrics (subrun_id, step, skipped, recorded_at) VALUES ('7.00', 1, 0, 0)",
])
def test_history_cannot_be_rewritten_even_by_hand(scripted_run, statement):
    connection = sqlite3.connect(scripted_run.run_dir / LOGBOOK_FILENAME)
    connection.execute("PRAGMA recursive_triggers=ON")  # makes REPLACE's implicit delete fire the trigger
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        connection.execute(statement)
    connection.close()
    with Logbook.open(scripted_run.run_dir) as book:
        assert len(book.all_metrics()) == len(scripted_run.recorded)
        assert book.lineage()[1].end_state == "restarting"


def test_writer_code_issues_no_update_or_delete():
    # Alongside the trigger test above: the writer never even tries.
    for module in (logbook.store, logbook.queries, logbook.norms_queries):
        source = Path(module.__file__).read_text()
        assert not re.search(r"\b(UPDATE|DELETE|REPLACE)\b", source), module.__name__


def test_a_newer_schema_is_refused_with_advice(tmp_path, clock):
    Logbook.open(tmp_path, clock=clock).close()
    connection = sqlite3.connect(tmp_path / LOGBOOK_FILENAME)
    connection.execute("INSERT INTO schema_version VALUES (?, 0)", (SCHEMA_VERSION + 1,))
    connection.commit()
    connection.close()
    with pytest.raises(LogbookError, match="upgrade runmgr"):
        Logbook.open(tmp_path, clock=clock)


def test_a_file_that_is_not_a_logbook_is_named(tmp_path):
    (tmp_path / LOGBOOK_FILENAME).write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(LogbookError, match=f"cannot open the logbook .*{LOGBOOK_FILENAME}"):
        Logbook.open(tmp_path)


def test_a_version_1_logbook_is_migrated_to_hold_local_norms_and_keeps_its_history(tmp_path, clock):
    """Migrated to the newest version: local norms (2), MFU and peak memory in the metrics (3)."""
    from logbook.schema import MIGRATIONS

    connection = sqlite3.connect(tmp_path / LOGBOOK_FILENAME)
    for statement in MIGRATIONS[1]:  # a logbook written before local norms existed
        connection.execute(statement)
    connection.execute("INSERT INTO schema_version VALUES (1, 0)")
    connection.commit()
    connection.close()
    with Logbook.open(tmp_path, clock=clock) as book:
        book.start_subrun("7.00", "launch", {}, None, 0, {}, {})
        book.record_metrics("7.00", [{"step": 1, "loss": 2.0}])
        assert book.record_local_norms("7.00", 1, {"output.weight": 0.5, "embedding.weight": float("nan")}) == 2
        versions = [v for (v,) in book._connection.execute("SELECT version FROM schema_version ORDER BY version")]
        assert versions == [1, 2, 3] == list(range(1, SCHEMA_VERSION + 1))
        (row,) = book.query(logbook.norms_queries.fetch_local_norms)
        assert row["step"] == 1 and row["norms"]["output.weight"] == 0.5 and math.isnan(row["norms"]["embedding.weight"])
    connection = sqlite3.connect(tmp_path / LOGBOOK_FILENAME)
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        connection.execute("DELETE FROM local_norms")
    connection.close()


def test_metrics_rows_hold_mfu_and_peak_memory_and_older_rows_read_none(tmp_path, clock):
    with Logbook.open(tmp_path, clock=clock) as book:
        book.start_subrun("7.00", "launch", {}, None, 0, {}, {})
        book.record_metrics("7.00", [{"step": 1, "loss": 2.0},
                                     {"step": 2, "loss": 1.9, "mfu": 0.41, "peak_memory_bytes": 3 << 30}])
        first, second = book.kept_metrics()
        assert first["mfu"] is None and first["peak_memory_bytes"] is None
        assert second["mfu"] == 0.41 and second["peak_memory_bytes"] == 3 << 30
