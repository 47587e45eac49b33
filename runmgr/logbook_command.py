"""``runmgr logbook ACTION ...``: browse a run's logbook. Each action is a
sub-parser of its own with exactly the options it takes, so an option of
another action is refused by argparse in one line (exit code 2) naming the
command and the action that takes it (runmgr/cli.py's ``parse_args``).

The logbook's readers live in the ``logbook`` package (logbook/cli.py); what
is runmgr's own is here: run names resolved under runs/, the skipped samples
decoded with the trainer's data stream, salvage holding the run directory's
lock. Everything is imported when the action runs, not when the parser is built.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from runmgr.errors import UserError

RUN_HELP = "run name (under runs/) or run directory"


def add_parser(sub) -> None:
    """Register ``logbook`` and its actions on the ``runmgr`` parser's subparsers."""
    book = sub.add_parser("logbook", help="browse a run's logbook")
    actions = book.add_subparsers(dest="action", required=True, parser_class=type(book))

    show = actions.add_parser("show", help="the run's timeline: its sub-runs, incidents and decisions")
    _run(show)
    show.add_argument("--full", action="store_true", help="incidents and decisions whole, not cut at 3 lines")
    show.add_argument("--json", action="store_true", help="one JSON object")
    show.set_defaults(func=_show)

    events = actions.add_parser("events", help="one line per event")
    _run(events)
    events.add_argument("--json", action="store_true", help="one JSON object per line")
    events.set_defaults(func=_events)

    metrics = actions.add_parser("metrics", help="the step rows, one JSON object per line")
    _run(metrics)
    metrics.add_argument("--json", action="store_true",
                         help="one JSON object per line (the rows always are: it changes nothing)")
    metrics.add_argument("--all", action="store_true", help="every sub-run's rows, also those rolled back")
    metrics.set_defaults(func=_metrics)

    listing = actions.add_parser("list", help="a run's sub-runs, or the runs of a folder (default: runs/)")
    listing.add_argument("run", nargs="?", metavar="RUN_OR_FOLDER",
                         help=f"{RUN_HELP}, or a folder of runs (default: runs/)")
    listing.add_argument("--json", action="store_true", help="the runs of a folder, one JSON object per line")
    listing.set_defaults(func=_list)

    skipped = actions.add_parser("skipped", help="the text of the samples a rollback skipped")
    _run(skipped)
    skipped.add_argument("--limit", type=int, default=3, metavar="N", help="samples decoded per skip range")
    skipped.add_argument("--chars", type=int, default=300, metavar="C", help="characters shown per sample")
    skipped.set_defaults(func=_skipped)

    salvage = actions.add_parser("salvage", help="copy the readable rows of a damaged logbook into a new one, "
                                                 "keeping the damaged file beside it")
    _run(salvage)
    salvage.set_defaults(func=_salvage)

    plot = actions.add_parser("plot", help="the curves as a PNG, coloured by sub-run, incidents marked")
    _run(plot)
    plot.add_argument("--metric", default=None, metavar="M1,M2",
                      help="metrics to draw, comma-separated, from loss, grad_norm, lr, loss_scale, "
                           "tokens_per_s, step_time (default: loss,grad_norm,lr, and loss_scale where a "
                           "step's loss scale is not 1, i.e. fp16)")
    plot.add_argument("--x", default="step", metavar="step|tokens|wall",
                      help="the x axis: the step (default), the tokens trained, or the wall-clock time since "
                           "the launch (downtime between sub-runs shows as gaps)")
    plot.add_argument("--out", default=None, metavar="FILE",
                      help="the PNG to write (default: RUN/plots/<metrics>.png)")
    plot.add_argument("--html", default=None, metavar="FILE.html",
                      help="also write an interactive page that works offline")
    plot.set_defaults(func=_plot)

    from logbook.markdown import EXPORT_FORMATS

    export = actions.add_parser("export", help="the chronicle as a document to paste into a team's notes")
    _run(export)
    export.add_argument("--format", choices=EXPORT_FORMATS, default=None,
                        help="the document to write (md, the default: the chronicle as Markdown, plots beside it)")
    export.add_argument("--out", default=None, metavar="FILE",
                        help="the document to write (default: RUN/<run name>.md)")
    export.set_defaults(func=_export)

    serve = actions.add_parser("serve", help="a read-only local web page over a run or a folder of runs")
    serve.add_argument("run", nargs="?", metavar="RUN_OR_FOLDER",
                       help=f"{RUN_HELP}, or a folder of runs (default: runs/)")
    serve.add_argument("--host", default=None, help="the address to listen on (default: 127.0.0.1, "
                                                    "this machine only)")
    serve.add_argument("--port", type=int, default=None, help="the port (default: 8642; 0: any free one)")
    serve.set_defaults(func=_serve)

    compare = actions.add_parser("compare", help="run B against run A step by step, with a verdict")
    compare.add_argument("run", metavar="RUN_A", help=RUN_HELP)
    compare.add_argument("other", metavar="RUN_B", help="the run judged against RUN_A")
    compare.add_argument("--baseline", nargs=2, default=None, metavar=("RUN_C", "RUN_D"),
                         help="two runs of the reference that differ only by noise; their step-by-step "
                              "difference is the band B - A is judged against (docs/compare.md)")
    compare.add_argument("--plot", default=None, metavar="FILE",
                         help="draw B - A against the band into FILE (.png or .html)")
    compare.add_argument("--json", action="store_true", help="the comparison as one JSON object")
    compare.set_defaults(func=_compare)

    norms = actions.add_parser("norms", help="which weights' gradient norms moved first and most around a step")
    _run(norms)
    norms.add_argument("--step", type=int, default=None, metavar="N",
                       help="the step to look around (an incident's onset)")
    norms.add_argument("--threshold", type=float, default=None, metavar="X",
                       help="a weight moved when its norm is X times its baseline (default 3)")
    norms.add_argument("--subrun", default=None, metavar="ID",
                       help="read the steps as this sub-run saw them (default: where an incident at N "
                            "was seen, else the newest)")
    norms.add_argument("--json", action="store_true", help="one JSON object")
    norms.set_defaults(func=_norms)


def _run(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", metavar="RUN", help=RUN_HELP)


def _run_dir(run: str) -> Path:
    from runmgr.status import resolve_run_dir

    return resolve_run_dir(run)


def _show(args: argparse.Namespace) -> int:
    from logbook.cli import show

    if args.full and args.json:
        raise UserError("`show --json` is always whole: drop --full (it is for the text chronicle)")
    return show(_run_dir(args.run), sys.stdout, full=args.full, as_json=args.json)


def _events(args: argparse.Namespace) -> int:
    from logbook.cli import events_jsonl, events_text

    return (events_jsonl if args.json else events_text)(_run_dir(args.run), sys.stdout)


def _metrics(args: argparse.Namespace) -> int:
    from logbook.cli import metrics_jsonl

    return metrics_jsonl(_run_dir(args.run), sys.stdout, kept=not args.all)


def _list(args: argparse.Namespace) -> int:
    """The runs under runs/ (or a folder of runs), or one run's sub-runs."""
    from logbook.cli import is_run_dir, list_runs, list_subruns

    run = args.run
    if run is None:
        return list_runs(Path("runs"), sys.stdout, as_json=args.json)
    if Path(run).is_dir() and not is_run_dir(run):
        return list_runs(Path(run), sys.stdout, as_json=args.json)
    if args.json:
        raise UserError(f"`list --json` lists the runs of a folder; for the sub-runs of {run} as JSON use "
                        f"`runmgr logbook show {run} --json`")
    return list_subruns(_run_dir(run), sys.stdout)


def _skipped(args: argparse.Namespace) -> int:
    from runmgr.logbook_samples import show_skipped

    return show_skipped(_run_dir(args.run), sys.stdout, limit=args.limit, chars=args.chars)


def _salvage(args: argparse.Namespace) -> int:
    """Refused on a logbook that opens; the files are swapped holding the run
    directory's lock, so that no driver starts meanwhile."""
    from logbook import Logbook, LogbookError
    from logbook.cli import salvage_logbook
    from runmgr.rundir import RunDirLock

    run_dir = _run_dir(args.run)
    try:
        Logbook.open(run_dir, create=False).close()
    except LogbookError:
        return salvage_logbook(run_dir, sys.stdout, hold=lambda: RunDirLock(run_dir))
    raise UserError(f"the logbook of {run_dir} opens and reads whole: nothing to salvage")


def _plot(args: argparse.Namespace) -> int:
    from logbook.cli import plot

    return plot(_run_dir(args.run), args.metric, sys.stdout, png=args.out, html=args.html, x=args.x)


def _export(args: argparse.Namespace) -> int:
    from logbook.cli import export

    return export(_run_dir(args.run), args.format or "md", Path(args.out) if args.out else None, sys.stdout)


def _serve(args: argparse.Namespace) -> int:
    """The read-only page over one run or a folder of runs (default: runs/); the
    skipped samples are decoded by runmgr (it needs the trainer's data stream)."""
    from logbook.cli import is_run_dir
    from logbook.web.server import DEFAULT_HOST, DEFAULT_PORT, serve

    run = args.run or "runs"
    root = Path(run) if Path(run).is_dir() and not is_run_dir(run) else _run_dir(run)
    return serve(root, sys.stdout, host=args.host or DEFAULT_HOST,
                 port=DEFAULT_PORT if args.port is None else args.port, decode_skipped=_skipped_text)


def _skipped_text(run_dir: Path) -> str:
    """What `runmgr logbook skipped RUN` prints, for the page's incident details."""
    import io

    from runmgr.logbook_samples import show_skipped

    text = io.StringIO()
    show_skipped(run_dir, text)
    return text.getvalue()


def _compare(args: argparse.Namespace) -> int:
    """``compare RUN_A RUN_B [--baseline RUN_C RUN_D] [--plot FILE] [--json]``."""
    from logbook.cli import compare

    baseline = tuple(_run_dir(run) for run in args.baseline) if args.baseline is not None else None
    return compare(_run_dir(args.run), _run_dir(args.other), sys.stdout, baseline=baseline, plot_path=args.plot,
                   as_json=args.json)


def _norms(args: argparse.Namespace) -> int:
    from logbook.cli import norms

    if args.step is None:
        raise UserError(f"`runmgr logbook norms` needs the step to look around: --step N (e.g. an incident's "
                        f"onset step in `runmgr logbook show {args.run}`)")
    return norms(_run_dir(args.run), args.step, sys.stdout, threshold=args.threshold, as_json=args.json,
                 subrun=args.subrun)
