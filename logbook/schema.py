"""The SQLite file behind a logbook: tables, version, and a durable connection.

Every record except metrics first takes a number in ``journal`` (its
sequence, i.e. the order things happened for the single writer), then its
typed row keyed by that number. Triggers refuse UPDATE and DELETE, so the
history is append-only even for someone poking at the file with sqlite3.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Callable, Optional

from logbook.errors import LogbookError

LOGBOOK_FILENAME = "logbook.sqlite"
"""The file in a run directory that holds its logbook (plus -wal/-shm beside it)."""

SCHEMA_VERSION = 3
"""Bumped with every change to the tables; older files are migrated on open
(2: ``local_norms``, per-weight gradient norms; 3: the metrics' ``mfu`` and
``peak_memory_bytes``)."""

_TABLES = (
    """CREATE TABLE schema_version (
        version INTEGER PRIMARY KEY, applied_at REAL NOT NULL)""",
    """CREATE TABLE journal (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, type TEXT NOT NULL,
        subrun_id TEXT NOT NULL, time REAL NOT NULL)""",
    """CREATE TABLE subrun_starts (
        seq INTEGER PRIMARY KEY REFERENCES journal(seq), subrun_id TEXT NOT NULL UNIQUE,
        run_number INTEGER NOT NULL, idx INTEGER NOT NULL, cause TEXT NOT NULL,
        evidence TEXT NOT NULL, start_checkpoint TEXT, start_step INTEGER NOT NULL,
        plan TEXT NOT NULL, config TEXT NOT NULL, config_diff TEXT NOT NULL)""",
    """CREATE TABLE subrun_ends (
        seq INTEGER PRIMARY KEY REFERENCES journal(seq),
        subrun_id TEXT NOT NULL UNIQUE REFERENCES subrun_starts(subrun_id),
        end_state TEXT NOT NULL, last_step INTEGER, reason TEXT)""",
    """CREATE TABLE incidents (
        seq INTEGER PRIMARY KEY REFERENCES journal(seq), kind TEXT NOT NULL,
        summary TEXT NOT NULL, evidence TEXT NOT NULL, step INTEGER,
        ranks TEXT NOT NULL, nodes TEXT NOT NULL)""",
    """CREATE TABLE decisions (
        seq INTEGER PRIMARY KEY REFERENCES journal(seq), incident_seq INTEGER REFERENCES incidents(seq),
        action TEXT NOT NULL, reason TEXT NOT NULL, plan TEXT NOT NULL)""",
    """CREATE TABLE events (
        seq INTEGER PRIMARY KEY REFERENCES journal(seq), kind TEXT NOT NULL,
        message TEXT NOT NULL, data TEXT, step INTEGER)""",
    """CREATE TABLE checkpoints (
        seq INTEGER PRIMARY KEY REFERENCES journal(seq), step INTEGER NOT NULL,
        path TEXT NOT NULL, seconds REAL)""",
    """CREATE TABLE metrics (
        subrun_id TEXT NOT NULL REFERENCES subrun_starts(subrun_id), step INTEGER NOT NULL,
        loss REAL, grad_norm REAL, lr REAL, loss_scale REAL, tokens INTEGER,
        tokens_per_s REAL, step_time REAL, time REAL, skipped INTEGER NOT NULL,
        consumed_samples INTEGER, recorded_at REAL NOT NULL,
        PRIMARY KEY (subrun_id, step))""",
)

_APPEND_ONLY_TABLES = (
    "schema_version", "journal", "subrun_starts", "subrun_ends",
    "incidents", "decisions", "events", "checkpoints", "metrics",
)


_LOCAL_NORMS_TABLE = """CREATE TABLE local_norms (
        subrun_id TEXT NOT NULL REFERENCES subrun_starts(subrun_id), step INTEGER NOT NULL,
        name TEXT NOT NULL, norm REAL, recorded_at REAL NOT NULL,
        PRIMARY KEY (subrun_id, step, name))"""
"""Version 2: each weight's gradient norm at the steps that reported them (docs/local_norms.md)."""


def _append_only_triggers(tables: tuple[str, ...] = _APPEND_ONLY_TABLES) -> list[str]:
    statements = []
    for table in tables:
        for verb in ("UPDATE", "DELETE"):
            statements.append(
                f"CREATE TRIGGER {table}_no_{verb.lower()} BEFORE {verb} ON {table} "
                f"BEGIN SELECT RAISE(ABORT, 'the logbook is append-only'); END"
            )
    return statements


MIGRATIONS: dict[int, list[str]] = {
    1: list(_TABLES) + _append_only_triggers(),
    2: [_LOCAL_NORMS_TABLE] + _append_only_triggers(("local_norms",)),
    # Model FLOPs utilisation (NULL when the device's peak is unknown) and the largest
    # rank's peak memory in bytes; rows written before have NULL in both.
    3: ["ALTER TABLE metrics ADD COLUMN mfu REAL", "ALTER TABLE metrics ADD COLUMN peak_memory_bytes INTEGER"],
}
"""Statements that bring a file from version ``v - 1`` to ``v``."""


def connect(path: Path) -> sqlite3.Connection:
    """A connection in autocommit mode with WAL and fsync on every commit.

    Autocommit (isolation_level=None) lets each write say exactly where its
    transaction begins and ends; synchronous=FULL makes a commit survive a
    power cut, not only a killed process.
    """
    connection = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False, timeout=30.0)
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("PRAGMA synchronous=FULL")
    connection.execute("PRAGMA foreign_keys=ON")
    return connection


def damage(connection: sqlite3.Connection) -> Optional[str]:
    """What SQLite finds wrong with the file's pages (its first complaint, one
    line), or None when they hold together. ``quick_check`` reads every page
    once: milliseconds for a demo's logbook, about a second for 100 MB."""
    try:
        rows = connection.execute("PRAGMA quick_check(1)").fetchall()
    except sqlite3.DatabaseError as err:
        return str(err)
    found = " ".join(str(rows[0][0]).split()) if rows else "no answer from quick_check"
    return None if found == "ok" else found


def damaged_message(path: Path, problem: str) -> str:
    """The one line that names a damaged logbook and the way forward."""
    return (f"the logbook {path} is damaged ({problem}): `runmgr logbook salvage {path.parent}` copies every "
            f"readable row into a new logbook and keeps the damaged file beside it")


def current_version(connection: sqlite3.Connection) -> int:
    """The schema version of the file; 0 for a file with no tables yet."""
    has_table = connection.execute(
        "SELECT 1 FROM sqlite_master WHERE type='table' AND name='schema_version'"
    ).fetchone()
    if not has_table:
        return 0
    return connection.execute("SELECT COALESCE(MAX(version), 0) FROM schema_version").fetchone()[0]


def ensure_schema(connection: sqlite3.Connection, clock: Callable[[], float], where: str) -> None:
    """Create or migrate the tables, each step one transaction; refuse newer files."""
    version = current_version(connection)
    if version > SCHEMA_VERSION:
        raise LogbookError(
            f"logbook at {where} has schema version {version}, newer than this runmgr "
            f"understands ({SCHEMA_VERSION}): upgrade runmgr to read it"
        )
    if version == SCHEMA_VERSION:
        return
    connection.execute("BEGIN IMMEDIATE")
    try:
        # Re-read under the write lock: another process may have just migrated.
        version = current_version(connection)
        for target in range(version + 1, SCHEMA_VERSION + 1):
            for statement in MIGRATIONS[target]:
                connection.execute(statement)
            connection.execute(
                "INSERT INTO schema_version (version, applied_at) VALUES (?, ?)", (target, clock())
            )
        connection.execute("COMMIT")
    except BaseException:
        connection.execute("ROLLBACK")
        raise
