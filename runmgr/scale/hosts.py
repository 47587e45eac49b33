"""Simulated ranks served through real Ray: many simulated nodes to one actor process.

A :class:`RankHost` is one Ray actor (one process) that holds the ranks of several simulated
nodes and answers, for each rank, the calls the driver makes of a rank's actor
(``describe``, ``reserve_port``, ``run``, ``drain``). :class:`SimulatedRanks` gives a
:class:`runmgr.workers.group.RayWorkerGroup` these ranks in place of one process each:
the group's code runs unchanged and makes one remote call per rank wherever it makes
one, so the driver's side of every figure is the real design's. What is not: a real
rank's process starts in seconds and its death reaches Ray through its raylet; here a
rank starts at once and its death is the host raising Ray's ``ActorDiedError`` for it.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import ray
from ray.exceptions import ActorDiedError

from runmgr.controller.group import WorkerInfo
from runmgr.errors import ClusterError
from runmgr.scale.ranks import JobScript, RankFault, RankView, SubrunSchedule

Slot = tuple[str, int, int]
"""One simulated rank's actor: its node, its rank and a serial number (unique per host)."""

MAX_CALLS_IN_FLIGHT = 1_000_000
"""A host answers every rank's ``run`` (pending until the rank ends) and ``drain`` at once."""


class RankHost:
    """The simulated ranks of some nodes, in one process. Their lockstep schedule is computed
    from the sub-run's first ``run`` call here, so every host of a sub-run agrees on it up to
    the moments the driver's ``run`` calls reach them."""

    def __init__(self, script: JobScript) -> None:
        self.schedules = Schedules(script)
        self._views: dict[Slot, RankView] = {}
        self._stops: dict[Slot, asyncio.Event] = {}

    async def describe(self, slot: Slot) -> WorkerInfo:
        return WorkerInfo(rank=slot[1], pid=os.getpid(), node_id=slot[0], node_ip="127.0.0.1")

    async def reserve_port(self, slot: Slot) -> int:
        return 0

    async def run(self, slot: Slot, config: Any, plan: Any, *_ignored: Any) -> None:
        """Until the rank's sub-run ends (None), its kill (Ray's ``ActorDiedError``), or its stop."""
        schedule = self.schedules.of(plan.subrun, plan_start(plan), config.training.train_iters)
        self._views = {slot: view for slot, view in self._views.items() if view.schedule is schedule}
        rank = slot[1]
        self._views[slot] = RankView(schedule, rank)
        stop = self._stops.setdefault(slot, asyncio.Event())
        fault = schedule.fault_at_stall()
        if fault is not None and fault.kind == "kill" and fault.rank == rank:
            if await sleep_until(schedule.fault_time(fault), stop):
                raise ActorDiedError()
            return None
        end = schedule.finished_at()
        await (stop.wait() if end is None else sleep_until(end, stop))
        self._stops.pop(slot, None)
        return None

    async def drain(self, slot: Slot) -> list[tuple[str, object]]:
        view = self._views.get(slot)
        return view.since(time.time()) if view is not None else []

    async def stop(self, slot: Slot) -> None:
        """The group killed this rank's actor: its ``run`` ends, it says nothing more."""
        self._stops.setdefault(slot, asyncio.Event()).set()
        self._views.pop(slot, None)

    async def met_faults(self) -> list[tuple[RankFault, float]]:
        """The faults the sub-runs here have reached so far, with when each happened."""
        return self.schedules.met_faults()


class Schedules:
    """A host's sub-run schedules: the one of the sub-run running now, computed from its first
    start here, with the faults no earlier sub-run met (a fault is met once per lineage)."""

    def __init__(self, script: JobScript) -> None:
        self.script = script
        self._current: Optional[SubrunSchedule] = None
        self._met: dict[RankFault, float] = {}

    def of(self, subrun: str, start_step: int, final_step: int) -> SubrunSchedule:
        if self._current is None or self._current.subrun != subrun:
            if self._current is not None:
                self._met.update(_met_by(self._current))
            self._current = SubrunSchedule(self.script, subrun, start_step, final_step, time.time(),
                                           tuple(f for f in self.script.faults if f not in self._met))
        return self._current

    def met_faults(self) -> list[tuple[RankFault, float]]:
        met = dict(self._met)
        if self._current is not None:
            met.update(_met_by(self._current))
        return sorted(met.items(), key=lambda item: item[1])


def _met_by(schedule: SubrunSchedule) -> dict[RankFault, float]:
    return {fault: schedule.fault_time(fault) for fault in schedule.met(time.time())}


RemoteRankHost = ray.remote(num_cpus=0, max_concurrency=MAX_CALLS_IN_FLIGHT)(RankHost)


def plan_start(plan: Any) -> int:
    """The step a simulated sub-run starts from: its checkpoint's (``sim://step/N``), or 0."""
    path = plan.start_checkpoint or ""
    return int(path.rsplit("/", 1)[1]) if path.startswith("sim://step/") else 0


async def sleep_until(deadline: float, stop: asyncio.Event) -> bool:
    """True when ``deadline`` came before the stop."""
    try:
        await asyncio.wait_for(stop.wait(), timeout=max(0.0, deadline - time.time()))
    except asyncio.TimeoutError:
        return True
    return False


class _Call:
    def __init__(self, host: Any, name: str, slot: Slot) -> None:
        self.host, self.name, self.slot = host, name, slot

    def remote(self, *args: Any) -> Any:
        return getattr(self.host, self.name).remote(self.slot, *args)


class SimulatedRankActor:
    """One simulated rank as a group sees a rank's actor: ``actor.drain.remote()`` is one
    remote call to its host, with its slot."""

    def __init__(self, host: Any, slot: Slot) -> None:
        self.host, self.slot = host, slot

    def __getattr__(self, name: str) -> _Call:
        return _Call(self.host, name, self.slot)


@dataclass
class SimulatedRanks:
    """Where a group's rank actors come from in the harness: ``ranks_per_node`` ranks on each
    simulated node, the nodes dealt to ``hosts`` in turn (:class:`runmgr.workers.group.RankActors`)."""

    hosts: Sequence[Any]
    nodes: Sequence[str]
    ranks_per_node: int
    _serial: int = 0

    def place(self, count: int, what: str, avoid_nodes: Sequence[str]) -> tuple[None, list]:
        usable = [(self.hosts[i % len(self.hosts)], node) for i, node in enumerate(self.nodes)
                  if node not in avoid_nodes]
        strategies = [where for where in usable for _ in range(self.ranks_per_node)][:count]
        if len(strategies) < count:
            raise ClusterError(f"{count} {what} need {count} slots; the simulated nodes outside the avoided ones "
                               f"hold {len(strategies)}")
        return None, strategies

    def create(self, strategy: tuple[Any, str], rank: int, world: int, driver: Any) -> SimulatedRankActor:
        host, node = strategy
        self._serial += 1
        return SimulatedRankActor(host, (node, rank, self._serial))

    def kill(self, actor: SimulatedRankActor) -> None:
        actor.host.stop.remote(actor.slot)

    def release(self, placement: Optional[object]) -> None:
        """Simulated nodes hold no Ray resources."""
