"""``runmgr simulate ettr``: the effective training time ratio of a long job at scale,
for today's restart path and the warm one, swept over checkpoint interval and restart cost."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Callable, TextIO

from runmgr.errors import UserError
from runmgr.simulate.assumptions import EttrAssumptions

if TYPE_CHECKING:
    from runmgr.simulate.ettr import EttrResult
    from runmgr.simulate.report import EttrReport

DEFAULT_INTERVALS = "10,25,50,100,200,400,800"
DEFAULT_RESTART_SCALES = "0.25,1,4"
THOROUGH_INTERVALS = "5,10,15,20,25,30,40,50,75,100,200,400,800,1600,3200"
"""``--thorough``'s interval sweep: every 5 steps around Young's interval (25), where the cold
path's best lies, and on past 800, where the default sweep leaves the warm path still rising."""
THOROUGH_RESTART_SCALES = "0.25,0.5,1,2,4,8"
"""``--thorough``'s restart costs: the factor 30 to 16,384 devices is a guess, so down to a
quarter of it and up to 8 x, by factors of 2."""
THOROUGH_EXTRA_SEEDS = 4
"""``--thorough`` replays each path's best interval over this many more draws of the failures
(seeds SEED+1 ...): how much the answer owes to one draw."""


@dataclass(frozen=True)
class Sweep:
    """What one ``simulate ettr`` runs: the intervals, the restart costs and the seeds of the
    failure draws (the first one's lineages make the tables; the others replay the best intervals)."""

    intervals: list[int]
    scales: list[float]
    seeds: list[int]

    @property
    def lineages(self) -> int:
        """Simulated lineages in all: each a progress line."""
        return 2 * len(self.intervals) + 2 * len(self.scales) + 2 * (len(self.seeds) - 1)


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
    ettr.add_argument("--intervals", default=None, metavar="K1,K2,...",
                      help=f"checkpoint intervals in steps to sweep (default {DEFAULT_INTERVALS})")
    ettr.add_argument("--restart-scales", default=None, metavar="X1,X2,...",
                      help="multiply both restart costs by each, at each path's best interval "
                           f"(default {DEFAULT_RESTART_SCALES}; empty: no sweep)")
    ettr.add_argument("--thorough", action="store_true",
                      help=f"the wide sweep (50 lineages, about 3 minutes here, docs/ettr.md): intervals {THOROUGH_INTERVALS}, "
                           f"restart costs x {THOROUGH_RESTART_SCALES}, and each path's best interval again over "
                           f"{THOROUGH_EXTRA_SEEDS} more draws of the failures (seeds SEED+1 ...); not with "
                           "--intervals or --restart-scales")
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


def sweep_of(args: argparse.Namespace) -> Sweep:
    """The sweep the options ask for: the defaults, the ones given, or ``--thorough``'s (which
    sets the intervals and restart costs itself, so giving either beside it is refused)."""
    if args.thorough:
        given = [flag for flag, value in (("--intervals", args.intervals), ("--restart-scales", args.restart_scales))
                 if value is not None]
        if given:
            raise UserError(f"--thorough sets {' and '.join(given)} itself ({THOROUGH_INTERVALS} steps, restart "
                            f"costs x {THOROUGH_RESTART_SCALES}): give --thorough or {' and '.join(given)}, not both")
    intervals = _numbers(_or(args.intervals, args.thorough, DEFAULT_INTERVALS, THOROUGH_INTERVALS), int,
                         "--intervals")
    if not intervals:
        raise UserError("--intervals needs at least one checkpoint interval, e.g. --intervals 25")
    scales = _numbers(_or(args.restart_scales, args.thorough, DEFAULT_RESTART_SCALES, THOROUGH_RESTART_SCALES),
                      float, "--restart-scales")
    extra = THOROUGH_EXTRA_SEEDS if args.thorough else 0
    return Sweep(intervals, scales, [args.seed + n for n in range(1 + extra)])


def _or(given: str | None, thorough: bool, default: str, wide: str) -> str:
    """The value given on the command line, else ``--thorough``'s, else the default."""
    return given if given is not None else wide if thorough else default


def cmd_simulate_ettr(args: argparse.Namespace) -> int:
    from runmgr.simulate.ettr import SimulationError, failures_for, simulate, sweep_intervals
    from runmgr.simulate.report import CostPoint, EttrReport, render

    assumptions = EttrAssumptions(**{item.name: getattr(args, item.name) for item in fields(EttrAssumptions)})
    problems = assumptions.problems()
    if problems:
        raise SimulationError(f"simulate ettr: {problems[0]}")
    sweep = sweep_of(args)
    failures = failures_for(assumptions, args.seed)
    progress = Progress(sweep.lineages, sys.stderr)
    by_interval = {warm: sweep_intervals(assumptions, warm, sweep.intervals, failures, done=progress.done)
                   for warm in (False, True)}
    report = EttrReport(assumptions, args.seed, len(failures), by_interval)
    points = []
    for scale in sweep.scales:
        scaled = replace(assumptions, cold_restart_s=assumptions.cold_restart_s * scale,
                         warm_restart_s=assumptions.warm_restart_s * scale)
        runs = {}
        for warm in (False, True):
            runs[warm] = simulate(replace(scaled, checkpoint_interval_steps=report.best(warm).checkpoint_interval_steps),
                                  warm, failures)
            progress.done(f"{'warm' if warm else 'cold'} restarts at {scale:g} x their cost")
        points.append(CostPoint(scale, scaled.cold_restart_s, scaled.warm_restart_s, runs[False], runs[True]))
    report = replace(report, by_restart_cost=points, by_seed=_other_draws(report, sweep.seeds[1:], progress))
    print(json.dumps(report.to_dict(), indent=1) if args.json else render(report), end="" if not args.json else "\n")
    return 0


def _other_draws(report: EttrReport, seeds: list[int], progress: Progress) -> dict[bool, list[EttrResult]]:
    """Each path's best interval replayed over the failures of each of ``seeds``."""
    from runmgr.simulate.ettr import failures_for, simulate

    if not seeds:
        return {}
    by_seed = {warm: [report.best(warm)] for warm in (False, True)}
    for seed in seeds:
        failures = failures_for(report.assumptions, seed)
        for warm in (False, True):
            best = replace(report.assumptions, checkpoint_interval_steps=report.best(warm).checkpoint_interval_steps)
            by_seed[warm].append(simulate(best, warm, failures))
            progress.done(f"{'warm' if warm else 'cold'} restarts at their best interval, failures of seed {seed}")
    return by_seed
