"""Simulated node agents served through real Ray: many simulated nodes' agents to one process.

A :class:`NodeAgentHost` is one Ray actor (one process) playing the agent of several simulated
nodes, as runmgr/workers/agent_group.py asks of an agent: it starts the node's simulated ranks
(runmgr/scale/ranks.py), hears what each says, sums them up per node
(runmgr/agents/summary.py, the code a real agent runs) and pushes the reports to the sub-run's
inbox every ``push_interval_s``, at once when a rank ended. :class:`SimulatedNodeAgents` gives an
:class:`runmgr.workers.agent_group.AgentWorkerGroup` these agents.

What differs from a real cluster: a host pushes its nodes' reports in one call where each node's
agent would make its own (the inbox, not the driver, takes those calls; docs/scale.md), and a
rank's death is the schedule's, not a process's exit seen by its agent.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import ray

from runmgr.agents.report import RankEnd
from runmgr.agents.summary import NodeSummariser
from runmgr.controller.group import WorkerInfo
from runmgr.errors import ClusterError
from runmgr.scale.hosts import MAX_CALLS_IN_FLIGHT, Schedules, plan_start, sleep_until
from runmgr.scale.ranks import JobScript, RankFault, RankView, SubrunSchedule
from runmgr.workers.agent_group import NodePlace


@dataclass
class SimulatedNode:
    """One simulated node's agent: its ranks' views, its summariser and where it pushes."""

    views: dict[int, RankView]
    summary: NodeSummariser
    inbox: Any
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    ends: list[RankEnd] = field(default_factory=list)
    """Ends not reported yet."""

    def report(self, now: float):
        """Hear every rank, then report the ends (a finished rank's last reports come first)."""
        for rank, view in self.views.items():
            self.summary.take(rank, view.since(now))
        for end in self.ends:
            self.summary.end(end)
            self.views.pop(end.rank, None)
        self.ends = []
        return self.summary.report(now)


class NodeAgentHost:
    """The agents of some simulated nodes, in one process, pushing together."""

    def __init__(self, script: JobScript, push_interval_s: float) -> None:
        self.schedules = Schedules(script)
        self.push_interval_s = push_interval_s
        self._nodes: dict[str, SimulatedNode] = {}
        self._wake = asyncio.Event()
        self._pushing: Optional[asyncio.Task] = None

    async def describe(self, key: str, node: str, ranks: Sequence[int]) -> list[WorkerInfo]:
        return [WorkerInfo(rank=rank, pid=os.getpid(), node_id=node, node_ip="127.0.0.1") for rank in ranks]

    async def start(self, key: str, node: str, ranks: Sequence[int], config: Any, plan: Any,
                    rank_nodes: Optional[dict[int, str]], inbox: Any) -> None:
        """Run the node's ranks until they end (each end pushed) or the node is stopped."""
        schedule = self.schedules.of(plan.subrun, plan_start(plan), config.training.train_iters)
        summary = NodeSummariser(node, plan.subrun, ranks, rank_nodes)
        sim = SimulatedNode({rank: RankView(schedule, rank) for rank in ranks}, summary, inbox)
        self._nodes[key] = sim
        if self._pushing is None or self._pushing.done():
            self._pushing = asyncio.get_running_loop().create_task(self._push_loop())
        await self._run(sim, schedule, ranks)
        if not sim.stop.is_set():
            await sim.stop.wait()  # stopped by the group, or every end pushed (the push loop stops it)

    async def _run(self, sim: SimulatedNode, schedule: SubrunSchedule, ranks: Sequence[int]) -> None:
        fault = schedule.fault_at_stall()
        if fault is not None and fault.kind == "kill" and fault.rank in ranks:
            if await sleep_until(schedule.fault_time(fault), sim.stop):
                self._end(sim, RankEnd(fault.rank, "died", f"simulated rank {fault.rank}'s process was killed",
                                       time.time(), -9))
            return  # the others wait in the step's collective until the group stops them
        end = schedule.finished_at()
        if end is not None and await sleep_until(end, sim.stop):
            for rank in ranks:
                self._end(sim, RankEnd(rank, "finished", "", time.time(), 0))

    def _end(self, sim: SimulatedNode, end: RankEnd) -> None:
        sim.ends.append(end)
        self._wake.set()  # a rank's end is pushed at once

    async def kill_rank(self, key: str, rank: int) -> None:
        sim = self._nodes.get(key)
        if sim is not None and rank in sim.views:
            self._end(sim, RankEnd(rank, "died", f"simulated rank {rank} killed by the driver", time.time(), -9))

    async def stop(self, key: str) -> None:
        """The group stopped the node: its ranks end and say nothing more."""
        sim = self._nodes.pop(key, None)
        if sim is not None:
            sim.stop.set()

    async def met_faults(self) -> list[tuple[RankFault, float]]:
        return self.schedules.met_faults()

    async def _push_loop(self) -> None:
        while self._nodes:
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self.push_interval_s)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            await self._push(time.time())

    async def _push(self, now: float) -> None:
        by_inbox: dict[Any, list] = {}
        for key, sim in list(self._nodes.items()):
            report = sim.report(now)
            if report is not None:
                by_inbox.setdefault(sim.inbox, []).append(report)
            if sim.summary.done:
                self._nodes.pop(key, None)
                sim.stop.set()
        for inbox, reports in by_inbox.items():
            await inbox.push.remote(reports)


RemoteNodeAgentHost = ray.remote(num_cpus=0, max_concurrency=MAX_CALLS_IN_FLIGHT)(NodeAgentHost)


@dataclass
class SimulatedNodeAgents:
    """Where an agent group's agents come from in the harness: ``ranks_per_node`` consecutive
    ranks on each simulated node, the nodes dealt to ``hosts`` in turn
    (:class:`runmgr.workers.agent_group.NodeAgents`)."""

    hosts: Sequence[Any]
    nodes: Sequence[str]
    ranks_per_node: int
    _serial: int = 0

    def place(self, world: int, avoid_nodes: Sequence[str]) -> list[NodePlace]:
        usable = [(self.hosts[i % len(self.hosts)], node) for i, node in enumerate(self.nodes)
                  if node not in avoid_nodes]
        if len(usable) * self.ranks_per_node < world:
            raise ClusterError(f"{world} workers need {world} slots; the simulated nodes outside the avoided ones "
                               f"hold {len(usable) * self.ranks_per_node}")
        places = []
        for first in range(0, world, self.ranks_per_node):
            host, node = usable[first // self.ranks_per_node]
            self._serial += 1  # an old sub-run's stop never reaches the new one's node
            ranks = tuple(range(first, min(first + self.ranks_per_node, world)))
            places.append(NodePlace(node, ranks, (host, f"{node}#{self._serial}")))
        return places

    def rendezvous(self, place: NodePlace) -> tuple[str, int]:
        return ("127.0.0.1", 0)  # simulated ranks meet nowhere

    def describe(self, place: NodePlace):
        host, key = place.where
        return host.describe.remote(key, place.node, place.ranks)

    def start(self, place: NodePlace, world: int, master: tuple[str, int], config: Any, plan: Any, rank_nodes: Any,
              inbox: Any):
        host, key = place.where
        return host.start.remote(key, place.node, place.ranks, config, plan, rank_nodes, inbox)

    def kill_rank(self, place: NodePlace, rank: int) -> None:
        host, key = place.where
        host.kill_rank.remote(key, rank)

    def dump_stacks(self, place: NodePlace) -> dict[int, str]:
        return {rank: f"rank {rank}: a simulated rank has no process to dump\n" for rank in place.ranks}

    def stop(self, place: NodePlace) -> None:
        host, key = place.where
        host.stop.remote(key)

    def release(self) -> None:
        pass  # the simulated nodes hold nothing of Ray's
