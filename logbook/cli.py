"""What ``runmgr logbook ...`` runs: functions taking parsed values and an
output stream, returning an exit code. A missing run raises LogbookError,
which the CLI prints as one line and maps to exit status 2."""

from __future__ import annotations

import json
from contextlib import nullcontext
from pathlib import Path
from typing import Callable, ContextManager, Optional, TextIO

from logbook.errors import LogbookError
from logbook.salvage import salvage
from logbook import queries
from logbook.accounting import SubRunCost
from logbook.render import chronicle, class_cost_block, incident_description, run_title
from logbook.report import RunReport, run_report
from logbook.schema import LOGBOOK_FILENAME
from logbook.store import Logbook
from logbook.textfmt import clock_text, duration, value_text

EVENT_TEXT_CHARS = 200
"""Plain ``events`` cuts each message here; ``--json`` (or ``show --full``) has it whole."""


def show(run_dir: str | Path, out: TextIO, width: int = 100, full: bool = False, as_json: bool = False) -> int:
    """Print the run's chronicle: header figures, what each incident class cost, then
    every sub-run (the evidence behind each line is in :func:`events_jsonl`). ``full``
    prints incidents and decisions whole instead of cutting them at a few lines;
    ``as_json`` prints :class:`logbook.report.RunReport` as one JSON object instead."""
    with Logbook.open(run_dir, create=False) as book:
        with book.snapshot():
            report = run_report(book)
            if as_json:
                out.write(json.dumps(report.to_dict()) + "\n")
                return 0
            lineage, events = book.lineage(), book.events()
            edges, recorded = book.query(queries.edge_metrics)
    costs = {sub.id: SubRunCost(sub.lost_steps, sub.redone_s, sub.downtime_s, sub.restart_s, sub.paused_s) for sub in report.subruns}
    lines = chronicle(run_title(lineage), lineage, events, edges, costs, report.summary, width,
                      run_dir=str(run_dir), full=full, recorded=recorded)
    header_end = lines.index("") if "" in lines else len(lines)  # the header ends at the first blank line
    lines[header_end:header_end] = class_cost_block(report.costs, report.mtbi_s, report.ettr_series, width)
    out.write("\n".join(lines) + "\n")
    return 0


def export(run_dir: str | Path, fmt: str, out_path: str | Path | None, out: TextIO) -> int:
    """Write the run's chronicle as a document (Markdown: ``RUN/<run name>.md``
    unless ``out_path`` is given) and print the path written."""
    from logbook.markdown import EXPORT_FORMATS, export_markdown

    if fmt not in EXPORT_FORMATS:
        raise LogbookError(f"no export format {fmt!r}: use one of {', '.join(EXPORT_FORMATS)}")
    target = Path(out_path) if out_path is not None else Path(run_dir) / f"{Path(run_dir).resolve().name}.md"
    with Logbook.open(run_dir, create=False) as book:
        written = export_markdown(book, target)
    out.write(f"{written}\n")
    return 0


def events_jsonl(run_dir: str | Path, out: TextIO) -> int:
    """Print every event, one JSON object per line, in the order they happened."""
    with Logbook.open(run_dir, create=False) as book:
        events = book.events()
    for event in events:
        out.write(json.dumps(event) + "\n")
    return 0


def events_text(run_dir: str | Path, out: TextIO) -> int:
    """Print every event as one readable line: time, sub-run, what happened."""
    with Logbook.open(run_dir, create=False) as book:
        events = book.events()
    for event in events:
        out.write(f"{clock_text(event['time'], with_date=True)}  {event['subrun']:<6} {event_line(event)}\n")
    return 0


def event_line(event: dict) -> str:
    """The gist of one journal record (its evidence is in ``--json``)."""
    kind = event["type"]
    at = f" at step {event['step']}" if event.get("step") is not None else ""
    if kind == "subrun_start":
        text = f"start from step {event['start_step']}: {event['cause']}"
    elif kind == "subrun_end":
        text = f"end: {event['end_state']} at step {event['last_step']}" + (
            f" — {event['reason']}" if event.get("reason") else "")
    elif kind == "incident":
        text = f"incident {event['kind']}{at}: {incident_description(event)}"
    elif kind == "decision":
        text = f"decision {event['action']}: {event['reason']}"
    elif kind == "checkpoint":
        text = f"checkpoint step {event['step']}: {event['path']}"
    else:
        text = f"{event['kind']}{at}: {event['message']}"
    return value_text(text, EVENT_TEXT_CHARS)


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


def list_runs(runs_root: str | Path, out: TextIO, as_json: bool = False) -> int:
    """One line per run directory under ``runs_root``: name, state, sub-runs, last
    step, ETTR, last incident (``as_json``: :func:`run_line` as one JSON object a line).
    A logbook that cannot be read is a line saying why (and how to salvage it);
    the exit status is then 1, as ``ls`` says some entries could not be read."""
    root = Path(runs_root)
    if not root.is_dir():
        raise LogbookError(
            f"no runs folder at {root}: launch a run first (`runmgr launch conf=demo`) "
            "or pass the folder that holds the run directories"
        )
    run_dirs = sorted(p for p in root.iterdir() if (p / LOGBOOK_FILENAME).is_file())
    if not run_dirs and not as_json:
        out.write(f"no runs under {root}\n")
        return 0
    name_width = max((len(p.name) for p in run_dirs), default=0)
    unreadable = 0
    for run_dir in run_dirs:
        try:
            with Logbook.open(run_dir, create=False) as book:
                line = run_line(run_report(book))
        except LogbookError as err:  # one damaged run hides none of the others
            unreadable += 1
            out.write(json.dumps({"name": run_dir.name, "error": str(err)}) + "\n" if as_json
                      else f"{run_dir.name:<{name_width}}  unreadable: {err}\n")
            continue
        out.write(json.dumps(line) + "\n" if as_json else _run_text(line, name_width))
    return 1 if unreadable else 0


def run_line(report: RunReport) -> dict:
    """What ``list`` says of one run."""
    return {"name": report.name, "state": report.state, "subruns": len(report.subruns),
            "last_step": report.summary["last_step"], "ettr": report.summary["ettr"],
            "last_incident": report.last_incident}


def _run_text(line: dict, name_width: int) -> str:
    ettr = "-" if line["ettr"] is None else f"{line['ettr']:.1%}"
    incident = value_text(line["last_incident"], 60) if line["last_incident"] else "no incident"
    return (f"{line['name']:<{name_width}}  {line['state']:<10} {line['subruns']:>3} sub-runs  "
            f"step {line['last_step']:<8} ETTR {ettr:>6}  last: {incident}\n")


def list_subruns(run_dir: str | Path, out: TextIO) -> int:
    """One line per sub-run of one run: id, start, steps, how it ended, why it started."""
    with Logbook.open(run_dir, create=False) as book:
        lineage = book.lineage()
    if not lineage:
        out.write(f"no sub-runs in {run_dir}\n")
        return 0
    for subrun in lineage:
        steps = f"steps {subrun.start_step}–{subrun.last_step if subrun.last_step is not None else '?'}"
        state = subrun.end_state or "open"
        took = duration(subrun.ended_at - subrun.started_at) if subrun.ended_at is not None else "-"
        out.write(f"{subrun.id:<6} {clock_text(subrun.started_at, with_date=True)}  {steps:<14} "
                  f"{state:<10} {took:>8}  {value_text(subrun.cause, 60)}\n")
    return 0


def salvage_logbook(run_dir: str | Path, out: TextIO, hold: Callable[[], ContextManager] = nullcontext) -> int:
    """Replace a damaged logbook by its readable rows (logbook/salvage.py);
    ``hold`` keeps drivers out of the run directory while the files are swapped."""
    report = salvage(run_dir, hold)
    out.write("\n".join(report.lines()) + f"\n`runmgr logbook show {run_dir}` reads the salvaged logbook\n")
    return 0


def plot(run_dir: str | Path, metrics_text: Optional[str], out: TextIO, png: Optional[str | Path] = None,
         html: Optional[str | Path] = None, x: str = "step") -> int:
    """Draw the run's curves against ``x`` (step, tokens or wall) into a PNG (``png``, default
    ``RUN/plots/<metrics>.png``) and, with ``html``, an interactive page too; print each path
    written. ``metrics_text`` None: logbook.plot.default_metrics. Names, suffixes and the axis
    are checked before anything is written."""
    from logbook.plot import default_metrics, parse_metrics, write_plots
    from logbook.plot_x import parse_x

    metrics = parse_metrics(metrics_text) if metrics_text is not None else None
    parse_x(x)
    if png is not None:
        _check_suffix(Path(png), ".png", "--out")
    if html is not None:
        _check_suffix(Path(html), ".html", "--html")
    with Logbook.open(run_dir, create=False) as book:
        metrics, notes = (metrics, []) if metrics is not None else default_metrics(book)
        png_path = Path(png) if png is not None else Path(run_dir) / "plots" / f"{'-'.join(metrics)}.png"
        written = write_plots(book, metrics, png_path, Path(html) if html is not None else None, x, notes)
    for path in written:
        out.write(f"{path}\n")
    return 0


def _check_suffix(path: Path, suffix: str, option: str) -> None:
    # matplotlib would pick another format from another suffix: the file would not be what was asked.
    if path.suffix.lower() != suffix:
        raise LogbookError(f"{option} {path} must end in {suffix}: name the file e.g. {path.with_suffix(suffix).name}")
    if path.is_dir():
        raise LogbookError(f"{option} {path} is a directory: name a file ending in {suffix}")


def norms(run_dir: str | Path, step: int, out: TextIO, threshold: Optional[float] = None, as_json: bool = False,
          subrun: Optional[str] = None) -> int:
    """Print which weights' gradient norms moved first and most from ``step`` on
    (logbook/norms_view.py; the analysis is logbook/local_norms.py)."""
    from logbook.local_norms import DEFAULT_THRESHOLD
    from logbook.norms_view import norms as print_norms

    return print_norms(run_dir, step, out, DEFAULT_THRESHOLD if threshold is None else threshold, as_json, subrun)


def is_run_dir(path: str | Path) -> bool:
    """True when ``path`` holds a logbook (a run), not a folder of runs."""
    return (Path(path) / LOGBOOK_FILENAME).is_file()


def compare(run_a: str | Path, run_b: str | Path, out: TextIO, baseline: Optional[tuple[str | Path, str | Path]] = None,
            plot_path: Optional[str | Path] = None, as_json: bool = False) -> int:
    """Judge run B against run A step by step (loss, grad norm), against the noise band
    of the baseline pair when given (logbook/compare.py says how); print the config
    diff, the rows and the verdict (``as_json``: one JSON object), and with
    ``plot_path`` draw the difference against the band (``.png`` or ``.html``)."""
    from logbook.compare_plot import check_plot_path, write_plot
    from logbook.compare_runs import compare_runs, read_run
    from logbook.compare_text import comparison_lines

    if plot_path is not None:
        check_plot_path(Path(plot_path))
    pair = read_run(run_a), read_run(run_b)
    base = (read_run(baseline[0]), read_run(baseline[1])) if baseline is not None else None
    result = compare_runs(*pair, base)
    written = write_plot(result, Path(plot_path)) if plot_path is not None else None
    if as_json:
        out.write(json.dumps({**result.to_dict(), "plot": str(written) if written else None}) + "\n")
        return 0
    out.write("\n".join(comparison_lines(result)) + "\n")
    if written is not None:
        out.write(f"plot: {written}\n")
    return 0
