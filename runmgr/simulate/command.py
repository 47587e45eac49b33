"""``runmgr simulate ettr``: the effective training time ratio of a long job at scale,
for today's restart path and the warm one, swept over checkpoint interval and restart cost."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import fields, replace
from typing import Callable, TextIO

from runmgr.errors import UserError
from runmgr.simulate.assumptions import EttrAssumptions

DEFAULT_INTERVALS = "10,25,50,100,200,400,800"
DEFAULT_RESTART_SCALES = "0.25,1,4"


def add_parser(sub) -> None:
    """Register ``simulate ettr`` on the ``runmgr`` parser's subparsers."""
    simulate = sub.add_parser("simulate", help="simulate a long job's faults with the real controller and policy")
    kinds = simulate.add_subparsers(dest="simulate_command", required=True, parser_class=type(simulate))
    ettr = kinds.add_parser("ettr", help="ETTR at scale (Llama 3's failure rates), cold vs warm restarts, swept "
                                         "over checkpoint interval and restart cost (docs/ettr.md)")
    for item in fields(EttrAssumptions):
        flag = "--" + item.name.replace("_", "-")
        ettr.add_argument(flag, dest=item.name, type=type(item.default), default=item.default,
                          help=f"(default {item.default:g}; docs/ettr.md)")
    ettr.add_argument("--seed", type=int, default=0, help="seed of the drawn failures (default 0)")
    ettr.add_argument("--intervals", default=DEFAULT_INTERVALS, metavar="K1,K2,...",
                      help=f"checkpoint intervals in steps to sweep (default {DEFAULT_INTERVALS})")
    ettr.add_argument("--restart-scales", default=DEFAULT_RESTART_SCALES, metavar="X1,X2,...",
                      help="multiply both restart costs by each, at each path's best interval "
                           f"(default {DEFAULT_RESTART_SCALES}; empty: no sweep)")
    ettr.add_argument("--json", action="store_true", help="the report as one JSON object")
    ettr.set_defaults(func=cmd_simulate_ettr)


def _numbers(text: str, kind, flag: str) -> list:
    try:
        values = [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UserError(f"{flag} takes comma-separated numbers, e.g. {flag} 10,25,50; got {text!r}") from None
    if any(not value > 0 for value in values):
        raise UserError(f"{flag}: every value must be > 0; got {text!r}")
    return values


class Progress:
    """One line on stderr per simulated lineage: which, how many of how many, and the time left
    at the pace so far (a sweep of 16,384 devices takes half a minute on 2 cores)."""

    def __init__(self, total: int, out: TextIO, clock: Callable[[], float] = time.monotonic) -> None:
        self.total, self.out, self.clock = total, out, clock
        self.started, self.count = clock(), 0

    def done(self, what: str) -> None:
        self.count += 1
        spent = self.clock() - self.started
        left = spent / self.count * (self.total - self.count)
        self.out.write(f"simulated {self.count}/{self.total}: {what} ({spent:.0f} s so far, about {left:.0f} s "
                       f"left)\n")
        self.out.flush()


def cmd_simulate_ettr(args: argparse.Namespace) -> int:
    from runmgr.simulate.ettr import SimulationError, failures_for, simulate, sweep_intervals
    from runmgr.simulate.report import CostPoint, EttrReport, render

    assumptions = EttrAssumptions(**{item.name: getattr(args, item.name) for item in fields(EttrAssumptions)})
    problems = assumptions.problems()
    if problems:
        raise SimulationError(f"simulate ettr: {problems[0]}")
    intervals = _numbers(args.intervals, int, "--intervals")
    if not intervals:
        raise UserError("--intervals needs at least one checkpoint interval, e.g. --intervals 25")
    scales = _numbers(args.restart_scales, float, "--restart-scales")
    failures = failures_for(assumptions, args.seed)
    progress = Progress(2 * len(intervals) + 2 * len(scales), sys.stderr)
    by_interval = {warm: sweep_intervals(assumptions, warm, intervals, failures, done=progress.done)
                   for warm in (False, True)}
    report = EttrReport(assumptions, args.seed, len(failures), by_interval)
    points = []
    for scale in scales:
        scaled = replace(assumptions, cold_restart_s=assumptions.cold_restart_s * scale,
                         warm_restart_s=assumptions.warm_restart_s * scale)
        runs = {}
        for warm in (False, True):
            runs[warm] = simulate(replace(scaled, checkpoint_interval_steps=report.best(warm).checkpoint_interval_steps),
                                  warm, failures)
            progress.done(f"{'warm' if warm else 'cold'} restarts at {scale:g} x their cost")
        points.append(CostPoint(scale, scaled.cold_restart_s, scaled.warm_restart_s, runs[False], runs[True]))
    report = replace(report, by_restart_cost=points)
    print(json.dumps(report.to_dict(), indent=1) if args.json else render(report), end="" if not args.json else "\n")
    return 0
