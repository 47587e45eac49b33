"""A logbook damaged inside (a few KB of garbage in the middle of the file):
every command that reads it says so in one line naming the file and the
salvage command, exit 2, no traceback; `logbook list` still lists the other
runs; `runmgr logbook salvage` copies every readable row into a new logbook,
keeps the damaged file beside it, and `show` reads the result.

The logbook is written by the real LogbookObserver over the controller
stepped with queued polls (tests/runmgr/controller/fakes.py), with the demo's
real config: 2 sub-runs, 300 steps, a worker death, checkpoints every 10."""

from __future__ import annotations

import random
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

from logbook import LOGBOOK_FILENAME, Logbook
from runmgr.config.compose import config_as_dict, load_run_config
from runmgr.controller.group import GroupPoll
from runmgr.observers.logbook_writer import LogbookObserver
from runmgr.resume import ResumePoint
from tests import cli
from tests.runmgr.controller.fakes import FakeGroup, died, make_controller, step_report
from trainer.report import CheckpointReport

ROOT = Path(__file__).resolve().parents[2]
TABLES = ("journal", "subrun_starts", "subrun_ends", "incidents", "decisions", "events", "checkpoints", "metrics")


def write_lineage(run_dir: Path) -> None:
    """1.00 trains 1-150 and loses rank 1; 1.01 resumes from step 140 and finishes at 300."""
    config = config_as_dict(load_run_config("demo", [f"run.dir={run_dir}", "chaos=none"]))

    def polls(subrun: str, first: int, last: int) -> list[GroupPoll]:
        return [GroupPoll(steps=[step_report(s, loss=2.0 + 1.0 / s, subrun=subrun) for s in range(at, at + 10)],
                          checkpoints=[CheckpointReport(subrun, at + 9, str(run_dir / f"checkpoints/step_{at + 9:08d}"),
                                                        0.5, 1000.0 + at)])
                for at in range(first, last, 10)]

    first = FakeGroup([*polls("1.00", 1, 150), GroupPoll(failures=[died(1)])])
    second = FakeGroup([*polls("1.01", 141, 300), GroupPoll(finished_ranks=[0, 1])])
    with Logbook.open(run_dir) as book:
        controller, _ = make_controller([first, second], observers=(LogbookObserver(book, config),),
                                        points={150: ResumePoint(str(run_dir / "checkpoints/step_00000140"), 140)})
        controller.run()


def rows_by_rowid(path: Path) -> dict[str, dict[int, tuple]]:
    """Every row of every table that SQLite can read, each read alone, by rowid;
    the rowids tried are those of the healthy file (``rows_by_rowid`` of it)."""
    connection = sqlite3.connect(path)
    found: dict[str, dict[int, tuple]] = {}
    try:
        for table in TABLES:
            found[table] = {}
            for rowid in range(1, 2000):
                try:
                    row = connection.execute(f"SELECT * FROM {table} WHERE rowid = ?", (rowid,)).fetchone()
                except sqlite3.DatabaseError:
                    continue
                if row is not None:
                    found[table][rowid] = row
    finally:
        connection.close()
    return found


def garble(path: Path) -> None:
    """A page of (seeded) garbage in the middle of the file, where SQLite keeps some of
    the metrics rows (the middle leaf page of that table, found with SQLite's dbstat):
    what a disk that garbles a few KB does, placed so that the file's schema pages,
    which every reader needs, stay whole however the run's rows happen to be laid out."""
    connection = sqlite3.connect(path)
    try:
        page_size = connection.execute("PRAGMA page_size").fetchone()[0]
        leaves = [page for (page,) in connection.execute(
            "SELECT pageno FROM dbstat WHERE name = 'metrics' AND pagetype = 'leaf' ORDER BY pageno")]
    finally:
        connection.close()
    page = leaves[len(leaves) // 2]
    with open(path, "r+b") as f:
        f.seek((page - 1) * page_size)
        f.write(random.Random(9).randbytes(page_size))


def runmgr(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return cli.runmgr(*args, cwd=cwd, timeout=120)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("runs")
    for name in ("healthy", "damaged"):
        write_lineage(root / name)
    logbook = root / "damaged" / LOGBOOK_FILENAME
    assert not Path(f"{logbook}-wal").exists()  # closed cleanly: everything is in the file itself
    healthy_rows = rows_by_rowid(logbook)
    garble(logbook)
    return {"root": root, "damaged": root / "damaged", "healthy_rows": healthy_rows,
            "damaged_bytes": logbook.read_bytes()}


@pytest.mark.parametrize("command", [
    ["logbook", "show", "{run}"], ["logbook", "metrics", "{run}"], ["logbook", "events", "{run}", "--json"],
    ["logbook", "list", "{run}"], ["logbook", "skipped", "{run}"],
    ["launch", "conf=demo", "run.dir={run}", "chaos=none", "health.skip=true"],
], ids=lambda c: " ".join(c[:2]))
def test_every_reader_of_a_damaged_logbook_says_so_in_one_line(runs, command):
    run = runs["damaged"]
    result = runmgr(*[part.format(run=run) for part in command])
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert f"the logbook {run / LOGBOOK_FILENAME} is damaged" in line
    assert f"`runmgr logbook salvage {run}`" in line
    assert (run / LOGBOOK_FILENAME).read_bytes() == runs["damaged_bytes"]  # nothing wrote into it
    assert not (run / "driver.lock").exists()  # the launch was refused before it took the run


def test_list_shows_the_other_runs_and_marks_the_damaged_one(runs):
    result = runmgr("logbook", "list", str(runs["root"]))
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    lines = dict(line.split(None, 1) for line in result.stdout.splitlines())
    assert lines["healthy"].split()[:4] == ["finished", "2", "sub-runs", "step"]
    assert lines["damaged"].startswith("unreadable: the logbook") and "logbook salvage" in lines["damaged"]


def test_salvage_keeps_every_readable_row_and_the_damaged_file(runs, tmp_path):
    run = tmp_path / "damaged"
    shutil.copytree(runs["damaged"], run)
    readable = rows_by_rowid(run / LOGBOOK_FILENAME)
    lost = sum(len(runs["healthy_rows"][t]) - len(readable[t]) for t in TABLES)
    assert lost > 0, "the garbage must have hit rows for this test to mean something"

    result = runmgr("logbook", "salvage", str(run))
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr

    # The damaged file is kept beside, byte for byte; the new logbook opens whole.
    (kept,) = run.glob("logbook.damaged-*.sqlite")
    assert kept.read_bytes() == runs["damaged_bytes"]
    salvaged = rows_by_rowid(run / LOGBOOK_FILENAME)
    report = {line.split()[0]: line for line in result.stdout.splitlines() if line.startswith("  ")}
    healthy = runs["healthy_rows"]
    for table in TABLES:
        assert f"{len(salvaged[table]):>7} rows kept" in report[table], (table, report[table])
        # every row kept is a row of the healthy file, unchanged (nothing garbled slips in)
        assert set(salvaged[table].values()) <= set(healthy[table].values()), table
        if table != "metrics":  # the garbage hit a page of metrics rows only: the rest is kept whole
            assert salvaged[table] == healthy[table], table
    assert 0 < len(salvaged["metrics"]) < len(healthy["metrics"])  # the rows of the other metrics pages
    assert sum(len(salvaged[t]) for t in TABLES) > 0

    # Still INSERT-only, and the chronicle reads it.
    connection = sqlite3.connect(run / LOGBOOK_FILENAME)
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        connection.execute("DELETE FROM journal")
    connection.close()
    show = runmgr("logbook", "show", str(run))
    assert show.returncode == 0 and "Traceback" not in show.stderr, show.stderr
    assert "1.00" in show.stdout
    again = runmgr("logbook", "salvage", str(run))
    assert again.returncode == 2 and "nothing to salvage" in again.stderr
