"""Salvage a damaged logbook: every row SQLite can still read goes into a new
logbook, and the damaged file is kept beside it.

A few KB of garbage inside the file (a failing disk, a stray write) make
SQLite refuse whole queries ("database disk image is malformed"), and
Python's sqlite3 module has no ``.recover``. So each table is read row range
by row range in rowid order; a range that fails is halved down to single
rows, and the rows that still fail are skipped. What was read is written into
a fresh logbook with the same schema, INSERT-only triggers included. A row
whose parent row was lost (a metric whose sub-run start is unreadable, an
incident whose journal entry is) is left out as well, so that the new
logbook holds together; the report counts both.

The damaged file (with its ``-wal``) is renamed
``logbook.damaged-<UTC time>.sqlite``, never deleted; SQLite only ever reads
a copy of it, so a refusal writes nothing in the run directory.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import tempfile
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, ContextManager, Iterable

from logbook.errors import LogbookError
from logbook.schema import LOGBOOK_FILENAME, SCHEMA_VERSION, connect, damage, ensure_schema

CHUNK_ROWS = 256
"""Rowids read per query before a failing range is halved."""
SIDE_FILES = ("-wal", "-shm")
"""SQLite's files beside the logbook; they belong to it and move with it."""
JSON_COLUMNS = frozenset({"evidence", "plan", "config", "config_diff", "data", "ranks", "nodes"})
"""Columns holding JSON text: a row whose JSON does not parse is garbled, not history."""
TYPED_TABLES = {"subrun_start": "subrun_starts", "subrun_end": "subrun_ends", "incident": "incidents",
                "decision": "decisions", "event": "events", "checkpoint": "checkpoints"}
"""Journal type -> the table holding that record's row under the same seq."""


@dataclass
class TableSalvage:
    """What became of one table."""

    table: str
    read: int = 0
    """Rows read from the damaged file."""
    kept: int = 0
    """Rows written into the new logbook."""
    unreadable: int = 0
    """Rowids whose reading failed (rows lost, or gaps that held none)."""

    @property
    def left_out(self) -> int:
        """Read, but garbled or orphaned by a lost parent row."""
        return self.read - self.kept


@dataclass
class SalvageReport:
    """The outcome of :func:`salvage`."""

    logbook: Path
    damaged_copy: Path
    problem: str
    tables: list[TableSalvage] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"salvaged {self.logbook} ({self.problem}):"]
        for t in self.tables:
            out.append(f"  {t.table:<14} {t.kept:>7} rows kept of {t.read} read"
                       + (f"; {t.left_out} left out (garbled, or their parent row is lost)" if t.left_out else "")
                       + (f"; {t.unreadable} unreadable" if t.unreadable else ""))
        out.append(f"the damaged file is kept as {self.damaged_copy}")
        return out


def salvage(run_dir: str | Path, hold: Callable[[], ContextManager] = nullcontext,
            clock: Callable[[], float] = time.time) -> SalvageReport:
    """Replace the damaged logbook of ``run_dir`` by one holding its readable rows.

    The file is read from a copy in the system's temp folder (nothing is
    written in ``run_dir`` until it is read whole); the new logbook is then
    written and swapped in inside ``hold()``, which keeps drivers out (the
    run directory's lock). Raises LogbookError when there is no logbook, it is
    not damaged, nothing of it can be read, or it changed while being read.
    """
    run_dir = Path(run_dir)
    path = run_dir / LOGBOOK_FILENAME
    if not path.is_file():
        raise LogbookError(f"no logbook at {path}: nothing to salvage")
    with tempfile.TemporaryDirectory(prefix="runmgr-salvage-") as scratch:
        copy = Path(scratch) / LOGBOOK_FILENAME
        before = _stamp(path)
        for suffix in ("", *SIDE_FILES):
            if Path(f"{path}{suffix}").is_file():
                shutil.copyfile(f"{path}{suffix}", f"{copy}{suffix}")
        problem, rows, tables = _read_damaged(copy, path)
    with hold():
        if _stamp(path) != before:
            raise LogbookError(f"{path} changed while it was read: stop whatever writes it, then salvage again")
        damaged_copy = run_dir / f"logbook.damaged-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(clock()))}.sqlite"
        fresh = run_dir / ".logbook.salvaged.sqlite"
        _write(fresh, rows, tables, clock)
        for suffix in ("", *SIDE_FILES):
            if Path(f"{path}{suffix}").is_file():
                Path(f"{path}{suffix}").rename(f"{damaged_copy}{suffix}")
        fresh.rename(path)
    return SalvageReport(path, damaged_copy, problem, list(tables.values()))


def _stamp(path: Path) -> tuple:
    """Size and modification time of the logbook and its WAL: equal stamps, same contents."""
    stamps = []
    for file in (path, Path(f"{path}-wal")):
        stamps.append((file.stat().st_size, file.stat().st_mtime_ns) if file.is_file() else None)
    return tuple(stamps)


def _read_damaged(copy: Path, original: Path) -> tuple[str, dict[str, list[dict]], dict[str, TableSalvage]]:
    """(what is wrong, readable rows by table, counts) of the copy of a damaged logbook."""
    connection = sqlite3.connect(str(copy), isolation_level=None)
    try:
        problem = damage(connection)
        if problem is None:
            raise LogbookError(f"the logbook {original} is not damaged: nothing to salvage")
        try:
            connection.execute("SELECT name FROM sqlite_master").fetchall()
            top = _fallback_top(connection)
        except sqlite3.DatabaseError as err:
            raise LogbookError(f"{original} cannot be read at all ({err}): nothing to salvage; "
                               "the file is left as it is") from None
        _refuse_newer(connection, original)
        present = {name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        rows, tables = {}, {}
        for table, columns in _columns().items():
            tables[table] = TableSalvage(table)
            # A table of a later schema version than the file's (local_norms in a version-1 file) holds nothing.
            rows[table] = _read_table(connection, table, columns, top, tables[table]) if table in present else []
    finally:
        connection.close()
    return problem, rows, tables


def _refuse_newer(connection: sqlite3.Connection, original: Path) -> None:
    try:
        version = connection.execute("SELECT MAX(version) FROM schema_version").fetchone()[0]
    except sqlite3.DatabaseError:
        return  # unreadable: the tables are read by the names this runmgr knows
    if version is not None and version > SCHEMA_VERSION:
        raise LogbookError(f"{original} has schema version {version}, newer than this runmgr understands "
                           f"({SCHEMA_VERSION}): salvage it with a newer runmgr")


def _columns() -> dict[str, dict[str, bool]]:
    """Every history table, parents first, and its columns (name -> NOT NULL),
    from the schema this runmgr writes."""
    with sqlite3.connect(":memory:") as schema:
        ensure_schema(schema, lambda: 0.0, where=":memory:")
        names = [n for (n,) in schema.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                               "AND name NOT LIKE 'sqlite_%' AND name != 'schema_version'")]
        # table_info rows: (cid, name, type, notnull, default, pk)
        return {n: {c[1]: bool(c[3]) for c in schema.execute(f"PRAGMA table_info({n})")} for n in names}


def _fallback_top(connection: sqlite3.Connection) -> int:
    """A rowid no row can exceed, for a table whose MAX(rowid) is unreadable:
    rows are never deleted, so rowids count up from 1, and a row takes at least
    a few bytes of a page."""
    page_count = connection.execute("PRAGMA page_count").fetchone()[0]
    page_size = connection.execute("PRAGMA page_size").fetchone()[0]
    return page_count * page_size // 8


def _read_table(connection: sqlite3.Connection, table: str, columns: dict[str, bool], fallback_top: int,
                counts: TableSalvage) -> list[dict]:
    """The rows of ``table`` that can be read, whole, in rowid order."""
    select = f"SELECT {', '.join(columns)} FROM {table} WHERE rowid >= ? AND rowid < ? ORDER BY rowid"
    try:
        top = connection.execute(f"SELECT MAX(rowid) FROM {table}").fetchone()[0] or 0
    except sqlite3.DatabaseError:
        top = fallback_top
    rows: list[tuple] = []

    def read(low: int, high: int) -> None:
        try:
            rows.extend(connection.execute(select, (low, high)).fetchall())
        except sqlite3.DatabaseError:
            if high - low == 1:
                counts.unreadable += 1
                return
            middle = (low + high) // 2
            read(low, middle)
            read(middle, high)

    for low in range(1, top + 1, CHUNK_ROWS):
        read(low, min(low + CHUNK_ROWS, top + 1))
    counts.read = len(rows)
    named = (dict(zip(columns, values)) for values in rows)
    return [row for row in named if _whole(row, columns)]


def _whole(row: dict, columns: dict[str, bool]) -> bool:
    """False for garbage read as a row: a NOT NULL column empty, or JSON that does not parse."""
    if any(row[name] is None for name, not_null in columns.items() if not_null):
        return False
    try:
        for name in JSON_COLUMNS.intersection(row):
            if row[name] is not None:
                json.loads(row[name])
    except (TypeError, ValueError):
        return False
    return True


def _consistent(rows: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """The rows whose parents survived: a typed record needs its journal entry
    and its sub-run's start; an end, a metric or a local norm its start; a decision its
    incident; a journal entry its typed record."""
    journal = {r["seq"]: r for r in rows["journal"]}
    starts = [r for r in rows["subrun_starts"] if r["seq"] in journal
              and journal[r["seq"]]["type"] == "subrun_start" and journal[r["seq"]]["subrun_id"] == r["subrun_id"]]
    started = {r["subrun_id"] for r in starts}

    def journaled(table: str, kind: str) -> list[dict]:
        return [r for r in rows[table] if r["seq"] in journal and journal[r["seq"]]["type"] == kind
                and journal[r["seq"]]["subrun_id"] in started]

    kept = {"subrun_starts": starts, **{t: journaled(t, k) for k, t in TYPED_TABLES.items() if k != "subrun_start"}}
    incidents = {r["seq"] for r in kept["incidents"]}
    kept["decisions"] = [r for r in kept["decisions"] if r["incident_seq"] is None or r["incident_seq"] in incidents]
    kept["subrun_ends"] = [r for r in kept["subrun_ends"] if r["subrun_id"] in started]
    typed = {r["seq"] for table in TYPED_TABLES.values() for r in kept[table]}
    kept["journal"] = [r for r in rows["journal"] if r["seq"] in typed]
    kept["metrics"] = [r for r in rows["metrics"] if r["subrun_id"] in started]
    kept["local_norms"] = [r for r in rows["local_norms"] if r["subrun_id"] in started]
    return kept


def _write(fresh: Path, rows: dict[str, list[dict]], tables: dict[str, TableSalvage],
           clock: Callable[[], float]) -> None:
    """A new logbook at ``fresh`` with the consistent rows, parents first."""
    kept = _consistent(rows)
    connection = connect(fresh)
    try:
        ensure_schema(connection, clock, where=str(fresh))
        connection.execute("BEGIN IMMEDIATE")
        for table in tables:  # in the order the schema creates them: parents first
            tables[table].kept = _insert(connection, table, kept[table])
        connection.execute("COMMIT")
    except BaseException:
        connection.close()
        for suffix in ("", *SIDE_FILES):  # our own half-written file, not the damaged one
            Path(f"{fresh}{suffix}").unlink(missing_ok=True)
        raise
    connection.close()


def _insert(connection: sqlite3.Connection, table: str, rows: Iterable[dict]) -> int:
    written = 0
    for row in rows:
        statement = f"INSERT INTO {table} ({', '.join(row)}) VALUES ({', '.join('?' for _ in row)})"
        try:
            connection.execute(statement, tuple(row.values()))
        except sqlite3.IntegrityError:  # garbage that reads as a row but breaks a constraint
            continue
        written += 1
    return written

