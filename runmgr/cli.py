"""The ``runmgr`` command. Argparse takes the subcommand; Hydra's compose API
takes ``conf=NAME key=value ...`` (``@hydra.main`` cannot take subcommands).

Anything a user can fix is one line on stderr and exit code 2. A local Ray that
runmgr starts and that does not come up in Ray's time, try after try (a busy
machine), is one line and exit code 4: run the same command again later.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from runmgr.errors import RayStartTimeoutError, UserError

EXIT_USER_ERROR = 2
EXIT_RAY_START_TIMEOUT = 4
"""The local Ray did not start within Ray's time, after runmgr's retries: nothing to fix, try again later."""
EXIT_BROKEN_PIPE = 141
"""128 + SIGPIPE: what ``cat`` or ``git log`` exit with when ``head`` stops reading."""


def _split_conf(items: list[str]) -> tuple[str, list[str]]:
    conf = [i for i in items if i.startswith("conf=")]
    if len(conf) != 1:
        raise UserError("name exactly one config, e.g. `runmgr launch conf=demo` (the names are the files in conf/*.yaml)")
    return conf[0].split("=", 1)[1], [i for i in items if not i.startswith("conf=")]


def cmd_launch(args: argparse.Namespace) -> int:
    conf, overrides = _split_conf(args.items)
    if not args.dry_run:
        refuse_bad_launch(conf, overrides, args.config_dir, rehearse=args.rehearse)
    from runmgr.launch import launch  # torch and Ray: only for a launch that passed the checks

    return launch(conf, overrides, dry_run=args.dry_run, conf_dir=args.config_dir, rehearse=args.rehearse)


def refuse_bad_launch(conf: str, overrides: list[str], conf_dir: Path | None, rehearse: bool = False) -> None:
    """What a launch can refuse from its config and the run directory alone,
    checked before torch and Ray are imported (seconds sooner) and before
    anything is written: the config, the data path, the directories, the logbook,
    and the S3 bucket of ``checkpoint.s3`` (its credentials, its existence, an answer)."""
    from runmgr.config.compose import load_run_config
    from runmgr.rehearsal import load_rehearsal, refuse_rehearse_settings
    from runmgr.rundir import check_run_dir
    from trainer.data import check_data_path

    if rehearse:
        config = load_rehearsal(conf, overrides, conf_dir)[0]
    else:
        refuse_rehearse_settings(overrides)
        config = load_run_config(conf, overrides, conf_dir)
    check_data_path(config.data)
    check_run_dir(config)
    kubernetes = config.kubernetes.launch_problems(config.cluster.address)  # the environment: only a launch tells
    if kubernetes:
        raise UserError(kubernetes[0])
    if config.checkpoint.s3.enabled:
        from runmgr.s3.client import S3Client, probe  # boto3: only for a run that mirrors its checkpoints

        probe(S3Client(config.checkpoint.s3, config.run.name))


def cmd_status(args: argparse.Namespace) -> int:
    from runmgr.status import read_status, render_status, resolve_run_dir

    status = read_status(resolve_run_dir(args.run))
    print(json.dumps(status, indent=1, sort_keys=True) if args.json else render_status(status))
    return 0


def cmd_logbook(args: argparse.Namespace) -> int:
    from logbook import cli as logbook_cli
    from runmgr.status import resolve_run_dir

    if args.action == "list":
        return _list(args.run, logbook_cli, args.json)
    if args.action == "serve":
        return _serve(args, logbook_cli)
    if args.host is not None or args.port is not None:
        raise UserError(f"--host and --port are for `runmgr logbook serve`, not `{args.action}`: drop them")
    if not args.run:
        raise UserError(f"`runmgr logbook {args.action}` needs a run name or directory, e.g. runs/demo")
    if args.action == "compare":
        return _compare(args, logbook_cli)
    if args.other is not None:
        raise UserError(f"`runmgr logbook {args.action}` takes one run, not {args.run} and {args.other}: "
                        "only `compare` takes two")
    if args.baseline is not None or args.plot is not None:
        raise UserError(f"--baseline and --plot are for `runmgr logbook compare`, not `{args.action}`")
    if args.action != "plot" and (args.metric is not None or args.html is not None):
        raise UserError(f"--metric and --html are for `runmgr logbook plot`, not `{args.action}`")
    if args.action != "norms" and (args.step is not None or args.threshold is not None or args.subrun is not None):
        raise UserError(f"--step, --threshold and --subrun are for `runmgr logbook norms`, not `{args.action}`")
    if args.action != "export" and args.format:
        raise UserError(f"--format is for `runmgr logbook export`, not `{args.action}`")
    if args.action not in ("plot", "export") and args.out is not None:
        raise UserError(f"--out is for `runmgr logbook plot` and `export`, not `{args.action}`")
    run_dir = resolve_run_dir(args.run)
    if args.action == "plot":
        from logbook.plot import DEFAULT_METRICS

        return logbook_cli.plot(run_dir, args.metric or ",".join(DEFAULT_METRICS), sys.stdout,
                                png=args.out, html=args.html)
    if args.action == "norms":
        if args.step is None:
            raise UserError(f"`runmgr logbook norms` needs the step to look around: --step N (e.g. an incident's "
                            f"onset step in `runmgr logbook show {args.run}`)")
        return logbook_cli.norms(run_dir, args.step, sys.stdout, threshold=args.threshold, as_json=args.json,
                                 subrun=args.subrun)
    if args.action == "salvage":
        return _salvage(run_dir, logbook_cli)
    if args.action == "show":
        if args.full and args.json:
            raise UserError("`show --json` is always whole: drop --full (it is for the text chronicle)")
        return logbook_cli.show(run_dir, sys.stdout, full=args.full, as_json=args.json)
    if args.action == "export":
        return logbook_cli.export(run_dir, args.format or "md", Path(args.out) if args.out else None, sys.stdout)
    if args.action == "events":
        return (logbook_cli.events_jsonl if args.json else logbook_cli.events_text)(run_dir, sys.stdout)
    if args.action == "skipped":
        from runmgr.logbook_samples import show_skipped

        return show_skipped(run_dir, sys.stdout, limit=args.limit, chars=args.chars)
    return logbook_cli.metrics_jsonl(run_dir, sys.stdout, kept=not args.all)


def _compare(args: argparse.Namespace, logbook_cli) -> int:
    """``compare RUN_A RUN_B [--baseline RUN_C RUN_D] [--plot FILE] [--json]``."""
    from runmgr.status import resolve_run_dir

    if args.other is None:
        raise UserError(f"`runmgr logbook compare` needs two runs, e.g. `runmgr logbook compare {args.run} OTHER_RUN`")
    stray = [flag for flag, value in (("--metric", args.metric), ("--html", args.html), ("--out", args.out),
                                      ("--format", args.format)) if value is not None]
    if stray or args.full or args.all:
        raise UserError(f"{', '.join(stray) or ('--full' if args.full else '--all')} is not an option of "
                        "`runmgr logbook compare`: it takes --baseline RUN_C RUN_D, --plot FILE and --json")
    baseline = tuple(resolve_run_dir(run) for run in args.baseline) if args.baseline is not None else None
    return logbook_cli.compare(resolve_run_dir(args.run), resolve_run_dir(args.other), sys.stdout,
                               baseline=baseline, plot_path=args.plot, as_json=args.json)


def _list(run: str | None, logbook_cli, as_json: bool) -> int:
    """``list``: the runs under runs/ (or a folder of runs), or one run's sub-runs."""
    from runmgr.status import resolve_run_dir

    if run is None:
        return logbook_cli.list_runs(Path("runs"), sys.stdout, as_json=as_json)
    if Path(run).is_dir() and not logbook_cli.is_run_dir(run):
        return logbook_cli.list_runs(Path(run), sys.stdout, as_json=as_json)
    if as_json:
        raise UserError(f"`list --json` lists the runs of a folder; for the sub-runs of {run} as JSON use "
                        f"`runmgr logbook show {run} --json`")
    return logbook_cli.list_subruns(resolve_run_dir(run), sys.stdout)


def _serve(args: argparse.Namespace, logbook_cli) -> int:
    """``serve``: the read-only page over one run or a folder of runs (default: runs/);
    the skipped samples are decoded by runmgr (it needs the trainer's data stream)."""
    from logbook.web.server import DEFAULT_HOST, DEFAULT_PORT, serve
    from runmgr.status import resolve_run_dir

    run = args.run or "runs"
    is_folder = Path(run).is_dir() and not logbook_cli.is_run_dir(run)
    root = Path(run) if is_folder else resolve_run_dir(run)
    return serve(root, sys.stdout, host=args.host or DEFAULT_HOST,
                 port=DEFAULT_PORT if args.port is None else args.port, decode_skipped=_skipped_text)


def _skipped_text(run_dir: Path) -> str:
    """What `runmgr logbook skipped RUN` prints, for the page's incident details."""
    import io

    from runmgr.logbook_samples import show_skipped

    text = io.StringIO()
    show_skipped(run_dir, text)
    return text.getvalue()


def _salvage(run_dir: Path, logbook_cli) -> int:
    """``salvage``: refused on a logbook that opens; the files are swapped
    holding the run directory's lock, so that no driver starts meanwhile."""
    from logbook import Logbook, LogbookError
    from runmgr.rundir import RunDirLock

    try:
        Logbook.open(run_dir, create=False).close()
    except LogbookError:
        return logbook_cli.salvage_logbook(run_dir, sys.stdout, hold=lambda: RunDirLock(run_dir))
    raise UserError(f"the logbook of {run_dir} opens and reads whole: nothing to salvage")


def cmd_watch_replay(args: argparse.Namespace) -> int:
    from runmgr.replay import main_replay

    conf = [i.split("=", 1)[1] for i in args.items if i.startswith("conf=")]
    overrides = [i for i in args.items if not i.startswith("conf=")]
    if len(conf) > 1:
        raise UserError("name at most one config, e.g. `runmgr watch replay FILE conf=demo`")
    return main_replay(args.file, args.json, sys.stdout, save_interval=args.save_interval,
                       conf=conf[0] if conf else None, overrides=overrides, conf_dir=args.config_dir)


def cmd_prepare_data(args: argparse.Namespace) -> int:
    from trainer.data.prepare import options_from, run

    return run(options_from(args))


class OneLineParser(argparse.ArgumentParser):
    """Usage mistakes are one line and exit code 2, like every user error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USER_ERROR, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def version() -> str:
    """The installed package's version (``pip install -e .`` records it)."""
    from importlib.metadata import PackageNotFoundError, version as installed_version

    try:
        return installed_version("runmgr")
    except PackageNotFoundError:
        return "unknown (not installed: run `make setup`)"


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="runmgr", description="Fault-tolerant run manager for LLM pretraining.")
    parser.add_argument("--version", action="version", version=f"runmgr {version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)

    launch = sub.add_parser("launch", help="compose a config and drive the run (resumes an existing lineage)")
    launch.add_argument("items", nargs="*", metavar="conf=NAME key=value", help="the config and its overrides")
    launch.add_argument("--dry-run", action="store_true", help="print the resolved plan; start nothing")
    launch.add_argument("--rehearse", action="store_true",
                        help="run the recipe at a size this machine holds (local Ray, a few hundred steps, the "
                             "chaos schedule; sizes in the rehearse section), as <run name>-rehearsal; with "
                             "--dry-run: how it maps to the real plan")
    launch.add_argument("--config-dir", type=Path, default=None, help="directory of the configs (default: ./conf)")
    launch.set_defaults(func=cmd_launch)

    status = sub.add_parser("status", help="the live state of a run")
    status.add_argument("run", help="run name (under runs/) or run directory")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=cmd_status)

    book = sub.add_parser("logbook", help="browse a run's logbook")
    book.add_argument("action", choices=("show", "events", "metrics", "list", "skipped", "salvage", "plot",
                                         "export", "serve", "compare", "norms"),
                      help="salvage: copy the readable rows of a damaged logbook into a new one, keeping the "
                           "damaged file beside it; serve: a read-only local web page over a run or a folder "
                           "of runs; compare: run B against run A step by step, with a verdict; norms: which "
                           "weights' gradient norms moved first and most around a step")
    book.add_argument("run", nargs="?", help="run name (under runs/) or run directory; for list also a "
                                             "folder of runs (default: runs/); for compare RUN_A")
    book.add_argument("other", nargs="?", metavar="RUN_B", help="compare: the run judged against RUN_A")
    book.add_argument("--baseline", nargs=2, default=None, metavar=("RUN_C", "RUN_D"),
                      help="compare: two runs of the reference that differ only by noise; their step-by-step "
                           "difference is the band B - A is judged against (docs/compare.md)")
    book.add_argument("--plot", default=None, metavar="FILE",
                      help="compare: draw B - A against the band into FILE (.png or .html)")
    book.add_argument("--json", action="store_true", help="events, list: one JSON object per line (metrics always "
                                                            "are); show, norms: one JSON object; "
                                                            "compare: the comparison as one JSON object")
    book.add_argument("--step", type=int, default=None, metavar="N",
                      help="norms: the step to look around (an incident's onset)")
    book.add_argument("--threshold", type=float, default=None, metavar="X",
                      help="norms: a weight moved when its norm is X times its baseline (default 3)")
    book.add_argument("--subrun", default=None, metavar="ID",
                      help="norms: read the steps as this sub-run saw them (default: where an incident at N "
                           "was seen, else the newest)")
    book.add_argument("--full", action="store_true", help="show: incidents and decisions whole, not cut at 3 lines")
    book.add_argument("--all", action="store_true", help="metrics: every sub-run's rows, also those rolled back")
    book.add_argument("--limit", type=int, default=3, metavar="N", help="skipped: samples decoded per skip range")
    book.add_argument("--chars", type=int, default=300, metavar="C", help="skipped: characters shown per sample")
    book.add_argument("--metric", default=None, metavar="M1,M2",
                      help="plot: metrics to draw, comma-separated, from loss, grad_norm, lr, loss_scale, "
                           "tokens_per_s, step_time (default: loss,grad_norm,lr,loss_scale)")
    book.add_argument("--out", default=None, metavar="FILE",
                      help="plot: the PNG to write (default: RUN/plots/<metrics>.png); export: the document "
                           "(default: RUN/<run name>.md)")
    book.add_argument("--html", default=None, metavar="FILE.html",
                      help="plot: also write an interactive page that works offline")
    from logbook.markdown import EXPORT_FORMATS

    book.add_argument("--format", choices=EXPORT_FORMATS, default=None,
                      help="export: the document to write (md, the default: the chronicle as Markdown, plots beside it)")
    book.add_argument("--host", default=None, help="serve: the address to listen on (default: 127.0.0.1, "
                                                    "this machine only)")
    book.add_argument("--port", type=int, default=None, help="serve: the port (default: 8642; 0: any free one)")
    book.set_defaults(func=cmd_logbook)

    watch = sub.add_parser("watch", help="run the detectors and the policy over a recorded log")
    watch_sub = watch.add_subparsers(dest="watch_command", required=True, parser_class=OneLineParser)
    replay = watch_sub.add_parser("replay", help="incidents and decisions of a recorded training log, without training")
    replay.add_argument("file", help="`runmgr logbook metrics/events --json` output, or a Megatron-LM / MindSpeed-LLM log")
    replay.add_argument("items", nargs="*", metavar="conf=NAME key=value",
                        help="the run's config and overrides: its watcher and policy settings judge the log")
    replay.add_argument("--config-dir", type=Path, default=None, help="directory of the configs (default: ./conf)")
    replay.add_argument("--json", action="store_true", help="one JSON object per incident")
    replay.add_argument("--save-interval", type=int, default=None,
                        help="checkpoint interval in steps, when the log does not say where checkpoints were")
    replay.set_defaults(func=cmd_watch_replay)

    from trainer.data.prepare import add_arguments as add_prepare_arguments

    prep = sub.add_parser("prepare-data", help="write a Megatron indexed dataset from text or JSONL")
    add_prepare_arguments(prep)
    prep.set_defaults(func=cmd_prepare_data)

    from runmgr.healthcheck.command import add_parser as add_health_check
    from runmgr.lint.command import add_parser as add_lint
    from runmgr.precision.command import add_parser as add_precision_check
    from runmgr.simulate.command import add_parser as add_simulate

    add_health_check(sub)
    add_lint(sub)
    add_precision_check(sub)
    add_simulate(sub)
    return parser


def user_error_types() -> tuple[type[BaseException], ...]:
    """Every exception that means 'the user can fix this' (imported lazily)."""
    from logbook import LogbookError
    from trainer.data import DataError
    from health.config import HealthConfigError
    from trainer.errors import CheckpointError, TrainerConfigError

    return (UserError, DataError, CheckpointError, TrainerConfigError, LogbookError, HealthConfigError)


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse, letting ``key=value`` items come on either side of the flags
    (``launch conf=X --dry-run k=v``): argparse fills a positional list once,
    so the items after a flag come back as extras and join it in order."""
    args, extras = parser.parse_known_args(argv)
    stray = [item for item in extras if item.startswith("-") or not hasattr(args, "items")]
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)}")
    if extras:
        args.items = [*args.items, *extras]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(build_parser(), argv)
    try:
        code = args.func(args)
        sys.stdout.flush()  # here, not at exit: a reader that went away (`| head`) is caught below
        return code
    except KeyboardInterrupt:
        print("runmgr: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return _reader_went_away()
    except RayStartTimeoutError as exc:  # before the user errors: not the input's fault, a code of its own
        print(f"runmgr: error: {exc}", file=sys.stderr)
        return EXIT_RAY_START_TIMEOUT
    except user_error_types() as exc:
        print(f"runmgr: error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR


def _reader_went_away() -> int:
    """The reader of stdout (``| head``) closed it: stop quietly. What is still
    buffered would fail again when Python flushes at exit, so stdout is
    pointed at /dev/null first."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
