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
    from runmgr.preflight import LaunchRequest, prepare_launch

    conf, overrides = _split_conf(args.items)
    prepared = prepare_launch(LaunchRequest(conf, tuple(overrides), args.config_dir, args.rehearse, args.dry_run))
    from runmgr.launch import launch  # torch and Ray: only for a launch that passed the pre-flight

    return launch(prepared)


def cmd_status(args: argparse.Namespace) -> int:
    from runmgr.status import read_status, render_status, resolve_run_dir

    status = read_status(resolve_run_dir(args.run))
    print(json.dumps(status, indent=1, sort_keys=True) if args.json else render_status(status))
    return 0


def cmd_watch_replay(args: argparse.Namespace) -> int:
    from runmgr.replay import main_replay

    from runmgr.config.compose import split_conf

    conf, overrides = split_conf(args.items, "runmgr watch replay FILE conf=demo")
    return main_replay(args.file, args.json, sys.stdout, save_interval=args.save_interval,
                       conf=conf, overrides=overrides, conf_dir=args.config_dir)


def cmd_watch_follow(args: argparse.Namespace) -> int:
    from runmgr.shadow.command import cmd_watch_follow as follow

    return follow(args)


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value <= 60:
        raise argparse.ArgumentTypeError(f"{text} must be above 0 and at most 60 seconds")
    return value


def cmd_approve(args: argparse.Namespace) -> int:
    from runmgr.approvals import answer

    return answer(args.run, args.command == "approve", sys.stdout)


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

    for verb, words in (("approve", "carry out the remedy the run holds for a person (policy.act_on)"),
                        ("decline", "go on without the remedy the run holds for a person")):
        held = sub.add_parser(verb, help=words)
        held.add_argument("run", help="run name (under runs/) or run directory")
        held.set_defaults(func=cmd_approve)

    from runmgr.logbook_command import add_parser as add_logbook

    add_logbook(sub)

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
    follow = watch_sub.add_parser("follow", help="follow a live Megatron-LM / MindSpeed-LLM log in shadow mode: "
                                                 "incidents and what runmgr would do, into a logbook, never done")
    follow.add_argument("source", help="the job's log file (it may not exist yet), its folder of per-rank logs, "
                                       "or - for standard input (`kubectl logs -f ... | runmgr watch follow -`)")
    follow.add_argument("items", nargs="*", metavar="conf=NAME key=value",
                        help="the job's config and overrides (default conf/shadow.yaml): its watcher and policy "
                             "judge the log; run.dir= says where the logbook goes")
    follow.add_argument("--config-dir", type=Path, default=None, help="directory of the configs (default: ./conf)")
    follow.add_argument("--poll-interval", type=positive_seconds, default=0.2, metavar="S",
                        help="seconds between two looks at the log (default 0.2)")
    follow.set_defaults(func=cmd_watch_follow)
    from runmgr.score.command import add_parser as add_score
    from runmgr.score.play_command import add_parser as add_play

    add_score(watch_sub)
    add_play(watch_sub)

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
        chosen, beside = _chosen_parser(parser, args)
        chosen.error(f"unrecognized arguments: {' '.join(stray)}{_belongs_to(stray, chosen, beside)}")
    if extras:
        args.items = [*args.items, *extras]
    return args


def _chosen_parser(parser: argparse.ArgumentParser,
                   args: argparse.Namespace) -> tuple[argparse.ArgumentParser, list[argparse.ArgumentParser]]:
    """The innermost sub-parser the command line chose (``runmgr logbook show``), so
    that a refusal names that command, and the sub-parsers beside it (the other actions)."""
    beside: list[argparse.ArgumentParser] = []
    while True:
        subparsers = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        chosen = subparsers.choices.get(getattr(args, subparsers.dest, None)) if subparsers else None
        if chosen is None:
            return parser, beside
        parser, beside = chosen, list(dict.fromkeys(subparsers.choices.values()))


def _belongs_to(stray: list[str], chosen: argparse.ArgumentParser, beside: list[argparse.ArgumentParser]) -> str:
    """``; --out is for `runmgr logbook plot` and `export``` for each stray option
    that a command beside the chosen one takes."""
    hints = []
    for flag in dict.fromkeys(item.split("=", 1)[0] for item in stray if item.startswith("--")):
        owners = [other.prog for other in beside if other is not chosen and flag in other._option_string_actions]
        if owners:
            names = [f"`{owners[0]}`", *(f"`{prog.rsplit(' ', 1)[-1]}`" for prog in owners[1:])]
            listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
            hints.append(f"; {flag} is for {listed}")
    return "".join(hints)


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
