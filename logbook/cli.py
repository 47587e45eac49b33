"""What ``runmgr logbook ...`` runs: functions taking parsed values and an
output stream, returning an exit code. A missing run raises LogbookError,
which the CLI prints as one line and maps to exit status 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TextIO

from logbook.errors import LogbookError
from logbook.render import chronicle, run_title
from logbook.schema import LOGBOOK_FILENAME
from logbook.store import Logbook


def show(run_dir: str | Path, out: TextIO, width: int = 100) -> int:
    """Print the run's chronicle: header figures, then every sub-run (the
    evidence behind each line is in :func:`events_jsonl`)."""
    with Logbook.open(run_dir, create=False) as book:
        lineage = book.lineage()
        lines = chronicle(run_title(lineage), lineage, book.events(), book.all_metrics(), book.costs(),
                          book.summary(), width, run_dir=str(run_dir))
    out.write("\n".join(lines) + "\n")
    return 0


def events_jsonl(run_dir: str | Path, out: TextIO) -> int:
    """Print every event, one JSON object per line, in the order they happened."""
    with Logbook.open(run_dir, create=False) as book:
        events = book.events()
    for event in events:
        out.write(json.dumps(event) + "\n")
    return 0


def metrics_jsonl(run_dir: str | Path, out: TextIO, kept: bool = True) -> int:
    """Print metrics rows, one JSON object per line: the kept lineage, or all.

    Floats are written as stored (json uses repr), so they compare bit for
    bit; NaN and infinities appear as JSON's NaN/Infinity extensions.
    """
    with Logbook.open(run_dir, create=False) as book:
        rows = book.kept_metrics() if kept else book.all_metrics()
    for row in rows:
        out.write(json.dumps(row) + "\n")
    return 0


def list_runs(runs_root: str | Path, out: TextIO) -> int:
    """One line per run directory under ``runs_root``: name, sub-runs, last state, last step."""
    root = Path(runs_root)
    if not root.is_dir():
        raise LogbookError(
            f"no runs folder at {root}: launch a run first (`runmgr launch conf=demo`) "
            "or pass the folder that holds the run directories"
        )
    run_dirs = sorted(p for p in root.iterdir() if (p / LOGBOOK_FILENAME).is_file())
    if not run_dirs:
        out.write(f"no runs under {root}\n")
        return 0
    name_width = max(len(p.name) for p in run_dirs)
    for run_dir in run_dirs:
        with Logbook.open(run_dir, create=False) as book:
            summary = book.summary()
        state = summary["last_state"] or ("open" if summary["subruns"] else "empty")
        out.write(f"{run_dir.name:<{name_width}}  {summary['subruns']:>3} sub-runs  "
                  f"{state:<10}  step {summary['last_step']}\n")
    return 0
