"""The simulator's report: ETTR by checkpoint interval for both restart paths, where
the time went at each path's best interval, and ETTR by restart cost."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from runmgr.simulate.assumptions import MEASURED_COLD_RESTART_S, WARM_RESTART_TARGET_S, EttrAssumptions
from runmgr.simulate.ettr import FAILURE_HORIZON, EttrResult, best
from runmgr.simulate.failures import LLAMA3_DAYS, LLAMA3_DEVICES, LLAMA3_INTERRUPTIONS, llama3_rate_per_device_s

PATHS = {False: "today's restart (cold)", True: "warm restart"}


@dataclass(frozen=True)
class CostPoint:
    """ETTR of both paths with every restart cost multiplied by ``scale``."""

    scale: float
    cold_restart_s: float
    warm_restart_s: float
    cold: EttrResult
    warm: EttrResult


@dataclass(frozen=True)
class EttrReport:
    assumptions: EttrAssumptions
    seed: int
    failures_drawn: int
    by_interval: dict[bool, list[EttrResult]]
    by_restart_cost: list[CostPoint] = field(default_factory=list)
    by_seed: dict[bool, list[EttrResult]] = field(default_factory=dict)
    """Each path's best interval over other draws of the failures (``--thorough``): seed, seed+1, ..."""

    def best(self, warm: bool) -> EttrResult:
        return best(self.by_interval[warm])

    def to_dict(self) -> dict:
        return {
            "assumptions": vars(self.assumptions) | {"train_steps": self.assumptions.train_steps},
            "seed": self.seed, "mtbf_s": mtbf_s(self.assumptions),
            "young_interval_s": young_interval_s(self.assumptions),
            "by_interval": {("warm" if warm else "cold"): [r.to_dict() for r in rows]
                            for warm, rows in self.by_interval.items()},
            "best": {("warm" if warm else "cold"): self.best(warm).to_dict() for warm in self.by_interval},
            "by_restart_cost": [{"scale": p.scale, "cold_restart_s": p.cold_restart_s,
                                 "warm_restart_s": p.warm_restart_s, "cold": p.cold.ettr, "warm": p.warm.ettr}
                                for p in self.by_restart_cost],
            "by_seed": {("warm" if warm else "cold"): [r.ettr for r in rows] for warm, rows in self.by_seed.items()},
        }


def mtbf_s(a: EttrAssumptions) -> float:
    """Mean seconds between interruptions of the whole job."""
    return 1.0 / (llama3_rate_per_device_s() * a.failure_scale * a.devices)


def young_interval_s(a: EttrAssumptions) -> float:
    """Young's optimal checkpoint interval, sqrt(2 x stall x MTBF) (cold path)."""
    return math.sqrt(2 * a.checkpoint_stall_s * mtbf_s(a))


def render(report: EttrReport) -> str:
    a = report.assumptions
    lines = [
        f"ETTR of a {a.days:g}-day job on {a.devices} devices ({a.devices // a.devices_per_node} nodes of "
        f"{a.devices_per_node}): failures at Llama 3's rates by class ({LLAMA3_INTERRUPTIONS} in {LLAMA3_DAYS:g} "
        f"days on {LLAMA3_DEVICES} GPUs, Table 5) x {a.failure_scale:g}: one every {mtbf_s(a) / 3600:.2f} h; "
        f"{report.failures_drawn} drawn (seed {report.seed}) over {FAILURE_HORIZON:g} x the failure-free span so "
        f"that a slow path never runs out of them, each run meeting those before its end (the fail column); "
        f"driven by runmgr's controller and policy",
        f"assumptions: step {a.step_time_s:g} s; checkpoint stall {a.checkpoint_stall_s:g} s; detection "
        f"{a.detect_s:g} s; cold restart {a.cold_restart_s:g} s ({MEASURED_COLD_RESTART_S:g} s measured here x "
        f"{a.cold_restart_s / MEASURED_COLD_RESTART_S:g}); warm restart {a.warm_restart_s:g} s "
        f"({WARM_RESTART_TARGET_S:g} s target here x {a.warm_restart_s / WARM_RESTART_TARGET_S:g}); snapshot "
        f"{a.snapshot_s:g} s every {a.snapshot_interval_steps} step(s); {a.warm_spares} ready spares, each "
        f"replaced {a.spare_refill_s:g} s after use",
        "",
        _interval_table(report),
        "",
        _best_lines(report),
        "",
        _where_table(report),
    ]
    if report.by_restart_cost:
        lines += ["", _cost_table(report)]
    if report.by_seed:
        lines += ["", _seed_lines(report)]
    return "\n".join(lines) + "\n"


def _interval_table(report: EttrReport) -> str:
    intervals = [r.checkpoint_interval_steps for r in next(iter(report.by_interval.values()))]
    rows = [f"{'checkpoint interval (steps)':<28}" + "".join(f"{k:>8}" for k in intervals)]
    for warm, results in report.by_interval.items():
        rows.append(f"  {PATHS[warm]:<26}" + "".join(f"{r.ettr:>8.2%}" for r in results))
    return "\n".join(rows)


def _best_lines(report: EttrReport) -> str:
    a = report.assumptions
    young = young_interval_s(a)
    parts = []
    for warm in report.by_interval:
        top = report.best(warm)
        parts.append(f"best {PATHS[warm]}: ETTR {top.ettr:.2%} with a checkpoint every "
                     f"{top.checkpoint_interval_steps} steps")
    cold, warm = (report.best(False), report.best(True)) if len(report.by_interval) == 2 else (None, None)
    if cold is not None and warm.ettr < cold.ettr:
        parts.append(f"choose the cold path here (controller.warm_spares=0): the warm path's snapshots take "
                     f"{warm.snapshots_s / 3600:.1f} h and save {(cold.restarts_s - warm.restarts_s) / 3600:.1f} h "
                     f"of restarts and {(cold.lost_work_s - warm.lost_work_s) / 3600:.1f} h of redone work at "
                     f"{cold.failures} failures: too few failures for a snapshot every "
                     f"{a.snapshot_interval_steps} step(s) to pay (--snapshot-interval-steps, or more devices)")
    parts.append(f"Young's interval for the cold path: sqrt(2 x {a.checkpoint_stall_s:g} s x {mtbf_s(a):.0f} s) = "
                 f"{young:.0f} s = {young / a.step_time_s:.0f} steps")
    return "\n".join(parts)


def _where_table(report: EttrReport) -> str:
    header = (f"{'where the time went (hours), best interval':<44}{'wall':>8}{'kept':>8}{'ckpt':>7}{'snap':>7}"
              f"{'detect':>7}{'restart':>8}{'lost':>7}{'fail':>6}{'cold':>6}{'warm':>6}{'redone':>8}")
    rows = [header]
    for warm in report.by_interval:
        r = report.best(warm)
        hours = [r.wall_s, r.productive_s, r.checkpoint_stalls_s, r.snapshots_s, r.detection_s, r.restarts_s,
                 r.lost_work_s]
        rows.append(f"  {PATHS[warm]:<42}" + "".join(f"{h / 3600:>{w}.1f}" for h, w in
                                                     zip(hours, (8, 8, 7, 7, 7, 8, 7)))
                    + f"{r.failures:>6}{r.cold_restarts:>6}{r.warm_restarts:>6}{r.steps_redone:>8}")
    return "\n".join(rows)


def _cost_table(report: EttrReport) -> str:
    points: Sequence[CostPoint] = report.by_restart_cost
    rows = [f"{'restart cost x (at the best intervals)':<40}" + "".join(f"{p.scale:>9g}" for p in points),
            f"  {'cold restart s':<38}" + "".join(f"{p.cold_restart_s:>9.0f}" for p in points),
            f"  {'ETTR cold':<38}" + "".join(f"{p.cold.ettr:>9.2%}" for p in points),
            f"  {'warm restart s':<38}" + "".join(f"{p.warm_restart_s:>9.1f}" for p in points),
            f"  {'ETTR warm':<38}" + "".join(f"{p.warm.ettr:>9.2%}" for p in points)]
    return "\n".join(rows)


def _seed_lines(report: EttrReport) -> str:
    """How much the best ETTRs owe to the one draw of failures the tables use."""
    draws = len(next(iter(report.by_seed.values())))
    rows = [f"the best intervals over {draws} draws of the failures (seeds {report.seed}-{report.seed + draws - 1}):"]
    for warm, results in report.by_seed.items():
        ettrs = [r.ettr for r in results]
        rows.append(f"  {PATHS[warm]:<26}ETTR {min(ettrs):.2%} to {max(ettrs):.2%} (mean {sum(ettrs) / draws:.2%}) "
                    f"with a checkpoint every {results[0].checkpoint_interval_steps} steps")
    return "\n".join(rows)
