"""``runmgr precision-check conf=A [key=value ...] [--against conf=B [key=value ...]
| --against-log FILE] [--steps N | --thorough] [--json]``: seed 004's protocol, on this machine.

Progress goes to stderr, the table (or ``--json``) to stdout. Exit codes: 0
the two agree at every stage compared, 1 some stage differs, 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional, TextIO

from runmgr.errors import UserError

EXIT_SAME, EXIT_DIFFERS = 0, 1


def add_parser(sub) -> None:
    """Register the subcommand on the ``runmgr`` parser's subparsers."""
    parser = sub.add_parser(
        "precision-check",
        help="a precision-tuning guide's check (docs/precision_check.md): pin both sides (2 layers, constant LR, no dropout, deterministic, one "
             "rank), compare step-1 loss, step-1 local norms, step-2 loss and N steps at LR 0; name the first "
             "stage that differs and the weights involved")
    parser.add_argument("items", nargs="*", metavar="conf=A key=value",
                        help="the reference: its config and overrides")
    other = parser.add_mutually_exclusive_group()  # one is needed: the refusal below says which
    other.add_argument("--against", nargs="+", default=None, metavar="conf=B key=value",
                       help="the other side: a config and its overrides, run here too")
    other.add_argument("--against-log", type=Path, default=None, metavar="MEGATRON_LOG",
                       help="the other side: a Megatron-LM / MindSpeed-LLM log of the pinned configuration "
                            "(--log-interval 1; a run at the pinned LR and/or one at LR 0)")
    parser.add_argument("--steps", type=int, default=None, metavar="N",
                        help="steps of the long run at LR 0 (default 100, about half a minute here; with "
                             "--against-log: the log's)")
    parser.add_argument("--thorough", action="store_true",
                        help="the long run as the precision guide runs it: 1000 steps at LR 0 (about 10 minutes "
                             "here, docs/precision_check.md); with --against, not with --steps")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    parser.add_argument("--config-dir", type=Path, default=None, help="directory of the configs (default: ./conf)")
    parser.set_defaults(func=cmd_precision_check)


def _say(err: TextIO):
    def say(line: str) -> None:
        err.write(line + "\n")
        err.flush()
    return say


def long_run_steps(args: argparse.Namespace) -> Optional[int]:
    """The long run's steps the options ask for (None: the default, or a log's own length).
    ``--thorough`` is 1000 steps, so a ``--steps`` beside it, or a log (whose LR-0 run is as long
    as the log says), contradicts it and is refused."""
    from runmgr.precision.check import THOROUGH_STEPS

    if args.steps is not None and args.steps < 1:
        raise UserError(f"--steps must be a positive number of steps, got {args.steps}")
    if not args.thorough:
        return args.steps
    if args.steps is not None:
        raise UserError(f"--thorough is --steps {THOROUGH_STEPS}: give --thorough or --steps {args.steps}, not both")
    if args.against_log is not None:
        raise UserError("--thorough is for --against: with --against-log the long run is as long as the log's "
                        "run at LR 0")
    return THOROUGH_STEPS


def cmd_precision_check(args: argparse.Namespace, out: Optional[TextIO] = None, err: Optional[TextIO] = None) -> int:
    from runmgr.precision.check import DEFAULT_STEPS, check_against_config, check_against_log
    from runmgr.precision.protocol import side_from_items
    from runmgr.precision.render import render

    reference = side_from_items(args.items, "the reference (before --against)")
    steps = long_run_steps(args)
    out, say = out or sys.stdout, _say(err or sys.stderr)
    if args.against is not None:
        other = side_from_items(args.against, "--against")
        report = check_against_config(reference, other, steps or DEFAULT_STEPS, args.config_dir, say)
    elif args.against_log is not None:
        if not args.against_log.is_file():
            raise UserError(f"--against-log {args.against_log}: no such file")
        report = check_against_log(reference, args.against_log, args.steps, args.config_dir, say)
    else:
        raise UserError("name the other side: --against conf=B [key=value ...] or --against-log MEGATRON_LOG")
    out.write(json.dumps(report.to_dict(), indent=1) + "\n" if args.json else render(report))
    return EXIT_SAME if report.same else EXIT_DIFFERS
