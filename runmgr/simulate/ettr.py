"""Effective training time ratio of a long job, simulated with the real controller and policy.

One lineage of ``days`` of training on ``devices`` devices is driven by
:class:`runmgr.controller.machine.Controller` and the real
:class:`runmgr.controller.judge.Judge` (the death classifier and the policy,
``watcher.enabled`` false: failures are judged as worker deaths) over a
simulated clock and worker group (runmgr/simulate/group.py). Failures are
drawn at Llama 3's rates by class; the policy decides each remedy (exclude the
node, restart; warm or cold); the group charges what each costs. The same
failures are replayed for every setting compared (common random numbers).

The policy's budgets are lifted (a 54-day lineage has hundreds of restarts;
:data:`SIMULATION_POLICY`), and every excluded node is replaced by a repaired
or spare one (the fleet keeps hot spares).
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, replace
from typing import Callable, Optional, Sequence

from runmgr.config.policy import HardwareConfig, PolicyConfig, RestartConfig
from runmgr.config.watcher import WatcherConfig
from runmgr.controller.judge import Judge
from runmgr.controller.machine import Controller, SubrunIds
from runmgr.controller.states import Failed, Launching
from runmgr.errors import UserError
from runmgr.policy.checkpoints import VerifiedCheckpoint
from runmgr.resume import ResumePoint
from runmgr.simulate.assumptions import EttrAssumptions
from runmgr.simulate.failures import Failure, draw_failures, llama3_rate_per_device_s
from runmgr.simulate.group import SimulatedGroup, WarmSimulatedGroup, checkpoint_path
from runmgr.simulate.world import SimWorld
from trainer.config import TrainerConfig
from trainer.plan import ResumePlan

UNLIMITED = 10**9
SIMULATION_POLICY = PolicyConfig(
    restarts=RestartConfig(max_restarts=UNLIMITED, storm_restarts=UNLIMITED, max_launch_retries=UNLIMITED),
    hardware=HardwareConfig(max_excluded_nodes=UNLIMITED),
)
"""The default policy with its budgets lifted: everything else (which failure excludes a
node, which restarts; warm or cold) is the policy's own."""
POLL_S = 3600.0
"""The simulated driver's poll; a failure ends a poll at once (plus ``detect_s``)."""
FAILURE_HORIZON = 4.0
"""Failures are drawn over this many times the failure-free span (a run slower than
that would see no failures past it: the simulation refuses such a result)."""


class SimulationError(UserError):
    """The simulated run could not finish as the assumptions say (one line)."""


@dataclass(frozen=True)
class EttrResult:
    """One simulated lineage: its ETTR and where its wall time went (seconds)."""

    warm_path: bool
    checkpoint_interval_steps: int
    ettr: float
    wall_s: float
    productive_s: float
    checkpoint_stalls_s: float
    snapshots_s: float
    detection_s: float
    restarts_s: float
    waits_s: float
    lost_work_s: float
    failures: int
    cold_restarts: int
    warm_restarts: int
    steps_redone: int

    def to_dict(self) -> dict:
        return asdict(self)


def failures_for(a: EttrAssumptions, seed: int) -> list[Failure]:
    """The failures every setting of one comparison replays."""
    rate = llama3_rate_per_device_s() * a.failure_scale
    return draw_failures(a.devices, a.train_steps * a.step_time_s * FAILURE_HORIZON, random.Random(seed),
                         rate_per_device_s=rate)


def simulate(a: EttrAssumptions, warm: bool, failures: Sequence[Failure], observers: Sequence = (),
             every_step: bool = False) -> EttrResult:
    """Drive the real controller and policy over ``failures`` until the job trained all its steps.
    ``observers``: the controller's (a logbook writer, a metrics exporter); ``every_step``: the
    group reports each step to them, as a run's rank 0 does (else the last of each poll)."""
    problems = a.problems()
    if problems:
        raise SimulationError(f"simulate ettr: {problems[0]}")
    # The warm path pays for its snapshots on every step it trains.
    world = SimWorld(a, list(failures), a.warm_step_time_s if warm else a.step_time_s)
    group_kind = WarmSimulatedGroup if warm else SimulatedGroup

    def make_group() -> SimulatedGroup:
        return group_kind(world, every_step)

    def checkpoints(max_step: int) -> list[VerifiedCheckpoint]:
        saved = world.saved_step
        return [VerifiedCheckpoint(saved)] if saved is not None and saved <= max_step else []

    def resume_at(step: Optional[int], why: str) -> ResumePoint:
        saved = world.saved_step
        if saved is None or step is None or saved > step:
            return ResumePoint(None, 0)
        return ResumePoint(checkpoint_path(saved), saved)

    def wait(seconds: float) -> None:
        world.ledger.waits += seconds
        world.clock.sleep(seconds)

    judge = Judge(WatcherConfig(enabled=False), SIMULATION_POLICY, checkpoints)
    controller = Controller(Launching("1.00", ResumePlan(subrun="1.00"), 0, "launch"), TrainerConfig(),
                            make_group=make_group, resume_at=resume_at, judge=judge, subrun_ids=SubrunIds(1, 1),
                            poll_interval_s=POLL_S, clock=world.clock.time, sleep=wait, observers=list(observers))
    end = controller.run()
    if isinstance(end, Failed):
        raise SimulationError(f"simulate ettr: the simulated run stopped at step {end.last_step}: {end.reason}")
    if world.clock.now > a.train_steps * a.step_time_s * FAILURE_HORIZON:
        raise SimulationError("simulate ettr: the run took longer than the span failures were drawn for "
                              f"({FAILURE_HORIZON:g}x its failure-free length); lower --failure-scale")
    return _result(a, warm, world)


def _result(a: EttrAssumptions, warm: bool, world: SimWorld) -> EttrResult:
    ledger, wall = world.ledger, world.clock.now
    productive = a.train_steps * a.step_time_s
    trained = a.train_steps + ledger.steps_redone
    snapshots = trained * (a.warm_step_time_s - a.step_time_s) if warm else 0.0
    restarts = ledger.cold_restarts + ledger.warm_restarts
    lost = wall - productive - ledger.checkpoint_stalls - snapshots - ledger.detection - restarts - ledger.waits
    return EttrResult(
        warm_path=warm, checkpoint_interval_steps=a.checkpoint_interval_steps, ettr=productive / wall, wall_s=wall,
        productive_s=productive, checkpoint_stalls_s=ledger.checkpoint_stalls, snapshots_s=snapshots,
        detection_s=ledger.detection, restarts_s=restarts, waits_s=ledger.waits, lost_work_s=max(0.0, lost),
        failures=ledger.failures, cold_restarts=ledger.cold_count - 1, warm_restarts=ledger.warm_count,
        steps_redone=ledger.steps_redone)


def sweep_intervals(a: EttrAssumptions, warm: bool, intervals: Sequence[int],
                    failures: Sequence[Failure], done: Callable[[str], None] = lambda what: None) -> list[EttrResult]:
    """One lineage per checkpoint interval, over the same failures; ``done(what)`` after each."""
    results = []
    for interval in intervals:
        results.append(simulate(replace(a, checkpoint_interval_steps=interval), warm, failures))
        done(f"{'warm' if warm else 'cold'} restarts, a checkpoint every {interval} steps")
    return results


def best(results: Sequence[EttrResult]) -> EttrResult:
    return max(results, key=lambda r: r.ettr)
