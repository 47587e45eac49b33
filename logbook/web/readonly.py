"""Opening a logbook so that nothing can change it: SQLite's read-only URI
(``mode=ro``) plus ``query_only``, so not even the WAL switch or a schema
migration that :meth:`Logbook.open` may do is possible from the page."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from logbook.errors import LogbookError
from logbook.schema import LOGBOOK_FILENAME, SCHEMA_VERSION, current_version
from logbook.store import Logbook


def open_read_only(run_dir: Path) -> Logbook:
    """The logbook of ``run_dir``, readable only; a LogbookError says why not."""
    path = run_dir / LOGBOOK_FILENAME
    if not path.is_file():
        raise LogbookError(f"no logbook at {run_dir}: pass a run directory or a folder of runs")
    try:
        connection = _connect(path, "mode=ro")
        try:
            version = current_version(connection)
        except sqlite3.OperationalError:
            if _wal_file(path).exists():
                raise
            # A read-only mount (the Kubernetes page's): a WAL database's reader must create the
            # -shm file beside it, which it cannot. With no -wal file no writer is open and the
            # file is whole: read it as immutable, which needs neither.
            connection.close()
            connection = _connect(path, "mode=ro&immutable=1")
            version = current_version(connection)
    except sqlite3.DatabaseError as err:
        raise LogbookError(f"cannot read the logbook {path}: {err} (is it a runmgr logbook?)") from None
    if version != SCHEMA_VERSION:
        connection.close()
        raise LogbookError(
            f"the logbook {path} has schema version {version}, this runmgr reads {SCHEMA_VERSION}: "
            "open it once with `runmgr logbook show` (which migrates) or upgrade runmgr")
    return Logbook(connection, run_dir, time.time)


def _connect(path: Path, query: str) -> sqlite3.Connection:
    connection = sqlite3.connect(f"{path.resolve().as_uri()}?{query}", uri=True, isolation_level=None,
                                 check_same_thread=False, timeout=30.0)
    connection.execute("PRAGMA query_only=ON")
    return connection


def _wal_file(path: Path) -> Path:
    return path.with_name(path.name + "-wal")
