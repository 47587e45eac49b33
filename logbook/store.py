"""The logbook of one run: an append-only, crash-safe SQLite file in the run
directory, written by the driver alone and readable by anyone, any time.

Crash safety: WAL journal with synchronous=FULL, and every write is its own
committed transaction (a metrics batch is one). A driver killed at any moment
loses at most the write in flight; the next open sees everything committed.
Nothing is ever updated or deleted: a sub-run's end is a row of its own.
"""

from __future__ import annotations

import math
import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence, TypeVar

from logbook import queries
from logbook.accounting import (Ledger, SubRunCost, furthest_step, ledger, lost_steps, needs_rows, split_metrics,
                                summary_of, superseded_from_ranges, superseded_from_rows)
from logbook.configdiff import config_diff
from logbook.errors import LogbookError
from logbook.ids import check_next, format_subrun_id, next_index, parse_subrun_id
from logbook.norms_queries import insert_local_norms
from logbook.records import (METRIC_COLUMNS, SubRun, metric_values, normalise_metric_row, out_of_range,
                             to_json, unholdable)
from logbook.schema import LOGBOOK_FILENAME, connect, damage, damaged_message, ensure_schema

_INSERT_METRICS = (
    f"INSERT OR IGNORE INTO metrics ({', '.join(METRIC_COLUMNS)}) "
    f"VALUES ({', '.join('?' for _ in METRIC_COLUMNS)})"
)
"""OR IGNORE: a step re-reported in the same sub-run keeps its first row."""

T = TypeVar("T")

ABANDONED_REASON = "no end was recorded: its driver stopped (crash or kill) before ending it"


class Logbook:
    """History of one run; open it with :meth:`Logbook.open`.

    Times are read from the injected ``clock`` (unix seconds). Checkpoint paths
    inside the run directory are stored relative to it, so a copied run
    directory stays whole; :meth:`resolve` turns a stored path back into one
    that can be opened.
    """

    def __init__(self, connection: sqlite3.Connection, run_dir: Path, clock: Callable[[], float]):
        self._connection = connection
        self._run_dir = run_dir
        self._clock = clock
        # One connection shared by the driver's threads: SQLite needs them in turn.
        self._lock = threading.RLock()
        self._out_of_range_noted: set[tuple[str, str]] = set()

    @classmethod
    def open(cls, run_dir: str | Path, clock: Callable[[], float] = time.time, create: bool = True,
             scratch: bool = False) -> "Logbook":
        """Open (and with ``create``, make) the logbook of ``run_dir``. ``scratch``: a logbook
        thrown away after use (``watch score``'s), written without waiting for the disk: not
        crash-safe, and never a run's."""
        run_dir = Path(run_dir)
        path = run_dir / LOGBOOK_FILENAME
        if not create and not path.is_file():
            raise LogbookError(
                f"no logbook at {run_dir}: run `runmgr launch conf=... run.name={run_dir.name}` "
                "first, or pass a run directory"
            )
        existed = path.is_file()
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
            connection = connect(path)
        except sqlite3.DatabaseError as err:
            if existed and "malformed" in str(err):  # damaged where even opening reads (its schema pages)
                raise LogbookError(damaged_message(path, str(err))) from None
            raise LogbookError(f"cannot open the logbook {path}: {err} (is it a runmgr logbook?)") from None
        except OSError as err:
            raise LogbookError(f"cannot open the logbook {path}: {err}") from None
        # A damaged file is named before anything reads (or writes) it: one line, and the salvage command.
        problem = damage(connection) if existed else None
        if problem is not None:
            connection.close()
            raise LogbookError(damaged_message(path, problem))
        if scratch:
            connection.execute("PRAGMA synchronous=OFF")
        try:
            ensure_schema(connection, clock, where=str(run_dir))
        except sqlite3.DatabaseError as err:
            connection.close()
            raise LogbookError(f"cannot open the logbook {path}: {err} (is it a runmgr logbook?)") from None
        return cls(connection, run_dir, clock)

    @property
    def run_dir(self) -> Path:
        """The run directory as it was given to :meth:`open`."""
        return self._run_dir

    def close(self) -> None:
        """Close the file; every committed write is already on disk."""
        with self._lock:
            self._connection.close()

    def __enter__(self) -> "Logbook":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def resolve(self, stored_path: Optional[str]) -> Optional[Path]:
        """A stored checkpoint path as a path to open (relative ones are in the run dir)."""
        if stored_path is None:
            return None
        path = Path(stored_path)
        return path if path.is_absolute() else self._run_dir / path

    # ---- writing -------------------------------------------------------

    def next_subrun_id(self, run_number: int) -> str:
        """``"12.00"`` for a new run, then ``"12.01"`` ... after the last one."""
        with self._lock:
            indices = [idx for (idx,) in self._connection.execute(
                "SELECT idx FROM subrun_starts WHERE run_number = ?", (run_number,))]
        return format_subrun_id(run_number, next_index(indices))

    def start_subrun(
        self, subrun_id: str, cause: str, evidence: dict, start_checkpoint: Optional[str],
        start_step: int, plan: dict, config: dict,
    ) -> SubRun:
        """Record a new sub-run; its config diff is taken against the previous one.

        A previous sub-run with no recorded end (its driver died) is first
        ended as ``abandoned`` at its last recorded step and time.
        """
        run_number, index = parse_subrun_id(subrun_id)
        if not isinstance(start_step, int) or start_step < 0:
            raise LogbookError(f"start_step of sub-run {subrun_id} must be an int >= 0, got {start_step!r}")
        with self._lock:
            lineage = queries.fetch_subruns(self._connection)
            check_next(subrun_id, [sub.id for sub in lineage], str(self._run_dir))
            previous = lineage[-1] if lineage else None
            diff = config_diff(previous.config, config) if previous else {}
            row = (subrun_id, run_number, index, str(cause), to_json(evidence, "evidence"),
                   self._portable(start_checkpoint), start_step, to_json(plan, "plan"),
                   to_json(config, "config"), to_json(diff, "config diff"))
            if previous is not None and previous.is_open:
                self._abandon(previous)
            with self._transaction():
                seq = self._journal("subrun_start", subrun_id)
                self._connection.execute(
                    "INSERT INTO subrun_starts (seq, subrun_id, run_number, idx, cause, evidence, "
                    "start_checkpoint, start_step, plan, config, config_diff) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", (seq, *row))
            return queries.fetch_subruns(self._connection)[-1]

    def end_subrun(self, subrun_id: str, end_state: str, last_step: Optional[int], reason: Optional[str]) -> None:
        """Record how a sub-run ended (``finished``, ``failed``, ``restarting`` ...)."""
        if not isinstance(end_state, str) or not end_state.replace("_", "").isalpha() or not end_state.islower():
            raise LogbookError(f"end state must be a lowercase word such as 'finished', got {end_state!r}")
        with self._lock:
            subrun = self._existing(subrun_id)
            if not subrun.is_open:
                raise LogbookError(
                    f"sub-run {subrun_id} already ended ({subrun.end_state} at step {subrun.last_step}): "
                    "a sub-run ends once; start the next one instead"
                )
            self._insert_end(subrun_id, end_state, held_step(last_step), reason, self._clock())

    def record_incident(
        self, subrun_id: str, kind: str, summary: str, evidence: dict,
        step: Optional[int] = None, ranks: Sequence[int] = (), nodes: Sequence[str] = (),
    ) -> int:
        """Record an incident with its evidence; returns its id for decisions."""
        values = (kind, summary, to_json(evidence, "incident evidence"), held_step(step),
                  to_json(list(ranks), "ranks"), to_json(list(nodes), "nodes"))
        return self._insert_journaled(
            "incident", subrun_id,
            "INSERT INTO incidents (seq, kind, summary, evidence, step, ranks, nodes) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            values)

    def record_decision(
        self, subrun_id: str, incident_id: Optional[int], action: str, reason: str, plan: dict,
    ) -> int:
        """Record what was decided about an incident (or with none, e.g. an operator)."""
        with self._lock:
            if incident_id is not None and not self._connection.execute(
                    "SELECT 1 FROM incidents WHERE seq = ?", (incident_id,)).fetchone():
                raise LogbookError(
                    f"no incident {incident_id} in this logbook: pass the id record_incident returned")
            return self._insert_journaled(
                "decision", subrun_id,
                "INSERT INTO decisions (seq, incident_seq, action, reason, plan) VALUES (?, ?, ?, ?, ?)",
                (incident_id, action, reason, to_json(plan, "decision plan")))

    def record_event(self, subrun_id: str, kind: str, message: str, data: Optional[dict] = None,
                     step: Optional[int] = None) -> int:
        """Record a free-form event (health report, checkpoint rejected, ...)."""
        encoded = None if data is None else to_json(data, "event data")
        return self._insert_journaled(
            "event", subrun_id,
            "INSERT INTO events (seq, kind, message, data, step) VALUES (?, ?, ?, ?, ?)",
            (kind, message, encoded, held_step(step)))

    def record_checkpoint(self, subrun_id: str, step: int, path: str, seconds: Optional[float]) -> int:
        """Record a verified checkpoint of ``step`` at ``path``."""
        return self._insert_journaled(
            "checkpoint", subrun_id,
            "INSERT INTO checkpoints (seq, step, path, seconds) VALUES (?, ?, ?, ?)",
            (int(step), self._portable(path), seconds))

    def record_metrics(self, subrun_id: str, rows: Sequence[dict]) -> int:
        """Record per-step metrics in one transaction; returns how many were new.

        A step already recorded for this sub-run is kept as first written. A number no column
        holds never costs the sub-run its record: a row whose step is one (past 2^63 - 1, NaN,
        infinite) is left out and the others kept, such a count (tokens, consumed samples) is
        recorded as none (NULL), a whole number past a double's range in a REAL column as
        infinite; the first of each field in a sub-run is said in a ``metrics_out_of_range`` event.
        """
        unheld = [(row, fields) for row in rows if (fields := out_of_range(row))]
        clean = [normalise_metric_row(subrun_id, row) for row in rows
                 if not (isinstance(row, dict) and unholdable(row.get("step")))]
        with self._lock:
            self._check_started(subrun_id)
            now = self._clock()
            with self._transaction():
                before = self._connection.total_changes
                self._connection.executemany(_INSERT_METRICS, [metric_values(subrun_id, row, now) for row in clean])
                added = self._connection.total_changes - before
            for row, fields in unheld:
                self._note_out_of_range(subrun_id, row, fields)
            return added

    def _note_out_of_range(self, subrun_id: str, row: dict, fields: Sequence[str]) -> None:
        """One ``metrics_out_of_range`` event for the first number of each field in the sub-run
        that no column holds (a job printing nothing else would otherwise write one per step)."""
        for name in fields:
            if (subrun_id, name) in self._out_of_range_noted:
                continue
            self._out_of_range_noted.add((subrun_id, name))
            shown = shown_number(row.get(name))
            done = "the row is left out" if name == "step" else "recorded as none"
            self.record_event(subrun_id, "metrics_out_of_range",
                              f"{name} {shown} at step {shown_number(row.get('step'))} is no whole number the logbook "
                              f"holds (from -2^63 to 2^63 - 1): {done}; later ones of this sub-run are not noted "
                              f"again", {"field": name, "value": shown})

    def record_local_norms(self, subrun_id: str, step: int, norms: dict[str, float]) -> int:
        """Record every weight's gradient norm at ``step`` in one transaction (the
        ``local_norms`` table, logbook/norms_queries.py); returns how many were new."""
        with self._lock:
            self._check_started(subrun_id)
            with self._transaction():
                return insert_local_norms(self._connection, subrun_id, step, norms, self._clock())

    # ---- reading -------------------------------------------------------

    def lineage(self) -> list[SubRun]:
        """Every sub-run, first first."""
        with self._lock:
            return queries.fetch_subruns(self._connection)

    def events(self) -> list[dict]:
        """Everything that happened, in order, as dicts with a ``type``."""
        with self.snapshot():
            return queries.fetch_events(self._connection)

    def all_metrics(self) -> list[dict]:
        """Every metrics row of every sub-run, lost ones included."""
        with self._lock:
            return queries.fetch_metrics(self._connection)

    def kept_metrics(self) -> list[dict]:
        """The metrics of the kept lineage, by step (see logbook.accounting)."""
        with self._lock:
            lineage, rows = queries.fetch_subruns(self._connection), queries.fetch_metrics(self._connection)
        kept, _ = split_metrics(lineage, rows)
        return kept

    def lost_steps(self, subrun_id: str) -> int:
        """Steps the previous sub-run trained past this one's start step."""
        with self._lock:
            lineage = queries.fetch_subruns(self._connection)
            position = self._position(subrun_id, lineage)
            if position == 0:
                return 0
            previous = lineage[position - 1]
            reached = furthest_step(previous, queries.max_metric_step(self._connection, previous.id))
            return lost_steps(reached, lineage[position].start_step)

    def reached_step(self, subrun_id: str) -> int:
        """How far a sub-run got: its recorded end step or its metrics, whichever is further."""
        with self._lock:
            subrun = self._existing(subrun_id)
            return furthest_step(subrun, queries.max_metric_step(self._connection, subrun_id))

    def costs(self) -> dict[str, SubRunCost]:
        """For each sub-run, what starting it cost (lost steps and seconds, downtime, restart)."""
        return self.ledger().costs

    def ledger(self) -> Ledger:
        """The lineage's books (logbook.accounting): SQL aggregates and a few range
        reads, so it answers fast on hundreds of thousands of steps."""
        with self.snapshot():
            lineage = queries.fetch_subruns(self._connection)
            return self._ledger(lineage, queries.last_activity(self._connection))

    def query(self, read: Callable[..., T], *args: Any) -> T:
        """``read(connection, *args)``: a reading function of logbook.queries (step_stats,
        metric_buckets ...) on this logbook, in turn with the driver's threads."""
        with self._lock:
            return read(self._connection, *args)

    def checkpoint_count(self, subrun_id: Optional[str] = None) -> int:
        """Checkpoints recorded, in all or in one sub-run."""
        with self._lock:
            return queries.checkpoint_count(self._connection, subrun_id)

    def summary(self, books: Optional[Ledger] = None) -> dict:
        """Run-level figures; ETTR is defined in logbook.accounting. ``books``: this
        logbook's :meth:`ledger`, read in the same :meth:`snapshot`, when already at hand."""
        with self.snapshot():
            lineage, activity = queries.fetch_subruns(self._connection), queries.last_activity(self._connection)
            books = books or self._ledger(lineage, activity)
            return summary_of(lineage, books, queries.incident_kinds(self._connection),
                              queries.checkpoint_count(self._connection), max(activity.values(), default=None))

    def live_figures(self, event_kinds: Sequence[str]) -> dict:
        """One consistent read for a live view (the metrics exporter): ``summary``
        (as :meth:`summary`), ``decisions`` (the action of each, in order),
        ``checkpoints`` ((seq, step, time recorded) each) and ``events`` ((seq, step)
        of each event of one of ``event_kinds``)."""
        with self.snapshot():
            return {"summary": self.summary(), "decisions": queries.decision_actions(self._connection),
                    "checkpoints": queries.checkpoint_times(self._connection),
                    "events": queries.event_steps(self._connection, event_kinds)}

    # ---- internals -----------------------------------------------------

    def _ledger(self, lineage: list[SubRun], activity: dict[str, float]) -> Ledger:
        stats = queries.step_stats(self._connection)
        if needs_rows(lineage, stats):  # a step recorded at or below its own start: walk the rows
            superseded = superseded_from_rows(lineage, queries.fetch_metrics(self._connection))
        else:
            superseded = superseded_from_ranges(
                lineage, stats, lambda sid, above, up_to: queries.step_range(self._connection, sid, above, up_to))
        return ledger(lineage, stats, superseded, activity)

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """Several reads that must agree: one read transaction, so a record the
        driver commits meanwhile (its journal row and its details together) is
        seen whole or not at all. Nested snapshots share the outer one."""
        with self._lock:
            if self._connection.in_transaction:
                yield
                return
            self._connection.execute("BEGIN")
            try:
                yield
            finally:
                self._connection.execute("COMMIT")

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        self._connection.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._connection.execute("ROLLBACK")
            raise
        self._connection.execute("COMMIT")

    def _journal(self, kind: str, subrun_id: str, at: Optional[float] = None) -> int:
        cursor = self._connection.execute(
            "INSERT INTO journal (type, subrun_id, time) VALUES (?, ?, ?)",
            (kind, subrun_id, self._clock() if at is None else at))
        return cursor.lastrowid

    def _insert_journaled(self, kind: str, subrun_id: str, statement: str, values: tuple) -> int:
        with self._lock:
            self._check_started(subrun_id)
            with self._transaction():
                seq = self._journal(kind, subrun_id)
                self._connection.execute(statement, (seq, *values))
            return seq

    def _insert_end(self, subrun_id: str, end_state: str, last_step: Optional[int],
                    reason: Optional[str], at: float) -> None:
        with self._transaction():
            seq = self._journal("subrun_end", subrun_id, at=at)
            self._connection.execute(
                "INSERT INTO subrun_ends (seq, subrun_id, end_state, last_step, reason) VALUES (?, ?, ?, ?, ?)",
                (seq, subrun_id, end_state, last_step, reason))

    def abandon(self, subrun_id: str) -> None:
        """End an open sub-run whose driver died, as ``abandoned``, at its last
        recorded step and at the time of its last record (not now)."""
        with self._lock:
            subrun = self._existing(subrun_id)
            if subrun.is_open:
                self._abandon(subrun)

    def _abandon(self, subrun: SubRun) -> None:
        last_step = furthest_step(subrun, queries.max_metric_step(self._connection, subrun.id))
        at = queries.last_activity(self._connection).get(subrun.id, subrun.started_at)
        self._insert_end(subrun.id, "abandoned", last_step, ABANDONED_REASON, at)

    def _existing(self, subrun_id: str) -> SubRun:
        lineage = queries.fetch_subruns(self._connection)
        return lineage[self._position(subrun_id, lineage)]

    def _check_started(self, subrun_id: str) -> None:
        # Cheap check for the per-step writes (the lineage decodes every config).
        if not self._connection.execute(
                "SELECT 1 FROM subrun_starts WHERE subrun_id = ?", (subrun_id,)).fetchone():
            raise self._no_such_subrun(subrun_id)

    def _position(self, subrun_id: str, lineage: list[SubRun]) -> int:
        for position, subrun in enumerate(lineage):
            if subrun.id == subrun_id:
                return position
        raise self._no_such_subrun(subrun_id)

    def _no_such_subrun(self, subrun_id: str) -> LogbookError:
        return LogbookError(
            f"no sub-run {subrun_id!r} in the logbook at {self._run_dir}: start it with start_subrun first"
        )

    def _portable(self, path: Optional[str]) -> Optional[str]:
        """Paths inside the run directory are stored relative to it."""
        if path is None:
            return None
        absolute = Path(path).resolve()
        try:
            return absolute.relative_to(self._run_dir.resolve()).as_posix()
        except ValueError:
            # Elsewhere: absolute, so that a relative stored path always means the run dir.
            return str(absolute)


def shown_number(value: object) -> str:
    """A number for a message: a whole number of more than 30 digits by its magnitude (``str()``
    refuses thousands of digits, and nobody reads them)."""
    if isinstance(value, int) and value.bit_length() > 100:
        return f"{'-' if value < 0 else ''}~10^{int((value.bit_length() - 1) * math.log10(2))}"
    return str(value)[:100]


def held_step(step: Optional[int]) -> Optional[int]:
    """The step of an event, an incident or a sub-run's end as its column holds it: none (NULL)
    for one no column can hold (the record itself is kept; its message says the rest)."""
    return None if unholdable(step) else step
