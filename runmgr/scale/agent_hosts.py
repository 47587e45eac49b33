"""Simulated node agents served through real Ray: many simulated nodes' agents to one process.

A :class:`NodeAgentHost` is one Ray actor (one process) playing the agent of several simulated
nodes, as runmgr/workers/agent_group.py asks of an agent: it starts the node's simulated ranks
(runmgr/scale/ranks.py), hears what each says, sums them up per node
(runmgr/agents/summary.py, the code a real agent runs) and pushes the reports to the sub-run's
inbox every ``push_interval_s``, at once when a rank ended. :class:`SimulatedNodeAgents` gives an
:class:`runmgr.workers.agent_group.AgentWorkerGroup` these agents.

Under warm recovery (a :class:`runmgr.agents.warm_link.WarmRun` given to ``start``) a simulated
agent answers what :class:`runmgr.workers.warm_agents.WarmAgentGroup` asks of a real one
(runmgr/workers/node_agent.py): ``start_spares`` (a simulated spare says it is ready
``init_s`` after its start, as a forked spare does once it built its model), ``waiting`` (the
survivors of a kill wait in their warm link from the kill on, as their collective fails),
``regroup`` (named spares become their ranks, every rank answered goes on in the new sub-run from
the step the driver names, ``init_s`` later) and the node serves until the group stops it.

What differs from a real cluster: a host pushes its nodes' reports in one call where each node's
agent would make its own (the inbox, not the driver, takes those calls; docs/scale.md), and a
rank's death is the schedule's, not a process's exit seen by its agent. A simulated rank or
spare has a process id of its own (unique in its host, not an OS pid) and no state: a warm
rejoin moves no tensors, builds no process group, and the spare's model is never built.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import ray

from runmgr.agents.report import RankEnd, SpareNews
from runmgr.agents.snapshots import SnapshotLedger
from runmgr.agents.summary import NodeSummariser
from runmgr.agents.warm_link import WAITING, PackedAnswer, WarmRun
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
    pids: dict[int, int]
    """Each rank's (and spare's, by its negative key) simulated process id."""
    schedule: SubrunSchedule
    final_step: int
    warm: Optional[WarmRun] = None
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    ends: list[RankEnd] = field(default_factory=list)
    """Ends not reported yet."""
    waiting: set[int] = field(default_factory=set)
    """Ranks that wait in their warm link (a peer broke the group) until ``regroup`` answers them."""
    said_waiting: set[int] = field(default_factory=set)
    """Of :attr:`waiting`, those whose ``waiting`` item went up already (once, as a rank's link sends it)."""
    spares: set[int] = field(default_factory=set)
    """The keys of the node's spares not named yet."""
    regrouped: asyncio.Event = field(default_factory=asyncio.Event)

    def report(self, now: float):
        """Hear every rank, then report the ends (a finished rank's last reports come first)."""
        for rank, view in self.views.items():
            self.summary.take(rank, view.since(now))
        for rank in sorted(self.waiting - self.said_waiting):
            self.summary.take(rank, [(WAITING, rank)])
            self.said_waiting.add(rank)
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
        self._pid = os.getpid() * 1000
        self._started: dict[str, asyncio.Event] = {}
        self.starts = 0
        """Ranks started by ``start`` (a warm recovery starts none: its survivors go on)."""

    def _new_pid(self) -> int:
        self._pid += 1
        return self._pid

    async def describe(self, key: str, node: str, ranks: Sequence[int]) -> list[WorkerInfo]:
        """The node's ranks once started (an async actor may take this call before ``start``)."""
        await self._started.setdefault(key, asyncio.Event()).wait()
        pids = self._nodes[key].pids if key in self._nodes else {}
        return [WorkerInfo(rank=rank, pid=pids.get(rank, 0), node_id=node, node_ip="127.0.0.1") for rank in ranks]

    async def start(self, key: str, node: str, ranks: Sequence[int], config: Any, plan: Any,
                    rank_nodes: Optional[dict[int, str]], inbox: Any, warm: Optional[WarmRun] = None) -> None:
        """Run the node's ranks until they end (each end pushed) or the node is stopped; ``warm``:
        they recover warm, and the node serves (spares, a regroup) until the group stops it."""
        final = config.training.train_iters
        schedule = self.schedules.of(plan.subrun, plan_start(plan), final)
        ledger = SnapshotLedger(warm.live) if warm is not None else None
        summary = NodeSummariser(node, plan.subrun, ranks, rank_nodes, ledger)
        sim = SimulatedNode({rank: RankView(schedule, rank) for rank in ranks}, summary, inbox,
                            {rank: self._new_pid() for rank in ranks}, schedule, final, warm)
        self.starts += len(ranks)
        self._nodes[key] = sim
        self._started.setdefault(key, asyncio.Event()).set()
        if self._pushing is None or self._pushing.done():
            self._pushing = asyncio.get_running_loop().create_task(self._push_loop())
        if warm is None:
            await self._run(sim, schedule)
        else:
            await self._run_warm(sim)
        if not sim.stop.is_set():
            await sim.stop.wait()  # stopped by the group, or every end pushed (the push loop stops it)

    async def _run(self, sim: SimulatedNode, schedule: SubrunSchedule) -> str:
        """Play ``schedule`` on the node's ranks: ``killed`` (a rank of the sub-run died: the node's
        are ended or waiting), ``ended`` (they finished) or ``stalled`` (a hang, or stopped)."""
        fault = schedule.fault_at_stall()
        if fault is not None and fault.kind == "kill":
            if not await sleep_until(schedule.fault_time(fault), sim.stop):
                return "stalled"
            if fault.rank in sim.views:
                self._end(sim, RankEnd(fault.rank, "died", f"simulated rank {fault.rank}'s process was killed",
                                       time.time(), -9, sim.pids.get(fault.rank)))
            if sim.warm is not None:  # their collective failed: they wait in their warm link
                sim.waiting = set(sim.views) - {fault.rank}
                self._wake.set()
            return "killed"  # cold: the others wait in the step's collective until the group stops them
        end = schedule.finished_at()
        if end is not None and await sleep_until(end, sim.stop):
            for rank in sim.views:
                self._end(sim, RankEnd(rank, "finished", "", time.time(), 0, sim.pids.get(rank)))
            return "ended"
        return "stalled"

    async def _run_warm(self, sim: SimulatedNode) -> None:
        """Sub-run after sub-run, each warm recovery's regroup starting the next on the same ranks."""
        while await self._run(sim, sim.schedule) == "killed":
            stopped = asyncio.ensure_future(sim.stop.wait())
            regrouped = asyncio.ensure_future(sim.regrouped.wait())
            await asyncio.wait([stopped, regrouped], return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            regrouped.cancel()
            if sim.stop.is_set():
                return
            sim.regrouped.clear()

    async def start_spares(self, key: str, count: int) -> list[int]:
        """``count`` spares on the node; each says it is ready ``init_s`` later (its model built)."""
        sim = self._nodes[key]
        keys = []
        for _ in range(count):
            spare = -1 - len([k for k in sim.pids if k < 0])  # runmgr/agents/rank_processes.py spare_key
            sim.pids[spare] = self._new_pid()
            sim.spares.add(spare)
            keys.append(spare)
            asyncio.get_running_loop().create_task(self._spare_ready(sim, spare))
        return keys

    async def _spare_ready(self, sim: SimulatedNode, spare: int) -> None:
        if await sleep_until(time.time() + self.schedules.script.init_s, sim.stop) and spare in sim.spares:
            sim.summary.add("spare", SpareNews(sim.summary.node, spare, "ready", sim.pids[spare], "",
                                               sim.summary.node, "127.0.0.1"))
            self._wake.set()

    async def waiting(self, key: str) -> list[int]:
        """The node's ranks that wait in their warm link (a recovery's question, and the probe's)."""
        sim = self._nodes.get(key)
        return sorted(sim.waiting) if sim is not None else []

    async def regroup(self, key: str, subrun: str, named: dict[int, int], answers: dict[int, Any],
                      rank_nodes: Optional[dict[int, str]], at_step: Optional[int] = None) -> list[WorkerInfo]:
        """A warm recovery on this node: each spare of ``named`` (key -> rank) becomes its rank,
        every rank of ``answers`` goes on in ``subrun`` from ``at_step``, the step the driver names.
        ``answers`` arrive packed (:class:`runmgr.agents.warm_link.PackedAnswer`), as a real agent
        gets them; a real rank reads the step from its unpacked answer, so the simulation is told
        it beside them (unpacking would import torch in the host, which a real agent never does)."""
        sim = self._nodes[key]
        step = at_step if at_step is not None else sim.schedule.start_step
        schedule = self.schedules.of(subrun, step, sim.final_step)
        adopted = []
        for spare, rank in named.items():
            sim.spares.discard(spare)
            sim.pids[rank] = sim.pids.pop(spare)
            sim.summary.adopt(rank)
            adopted.append(WorkerInfo(rank, sim.pids[rank], sim.summary.node, "127.0.0.1"))
        sim.summary.subrun = subrun
        if rank_nodes is not None:
            sim.summary.rank_nodes = dict(rank_nodes)
        sim.views = {rank: RankView(schedule, rank, rejoined=True) for rank in answers}
        sim.waiting, sim.said_waiting, sim.schedule = set(), set(), schedule
        sim.regrouped.set()
        return adopted

    def _end(self, sim: SimulatedNode, end: RankEnd) -> None:
        sim.ends.append(end)
        self._wake.set()  # a rank's end is pushed at once

    async def kill_rank(self, key: str, rank: int) -> None:
        """End ``rank`` (a spare by its key: its loss is pushed as a forked spare's is)."""
        sim = self._nodes.get(key)
        if sim is not None and rank in sim.spares:
            sim.spares.discard(rank)
            sim.summary.add("spare", SpareNews(sim.summary.node, rank, "lost", sim.pids[rank], "killed by the driver",
                                               sim.summary.node, "127.0.0.1"))
            self._wake.set()
        elif sim is not None and rank in sim.views:
            self._end(sim, RankEnd(rank, "died", f"simulated rank {rank} killed by the driver", time.time(), -9,
                                   sim.pids.get(rank)))

    async def stop(self, key: str) -> None:
        """The group stopped the node: its ranks end and say nothing more."""
        sim = self._nodes.pop(key, None)
        self._started.pop(key, None)
        if sim is not None:
            sim.stop.set()

    async def met_faults(self) -> list[tuple[RankFault, float]]:
        return self.schedules.met_faults()

    async def ready(self) -> bool:
        return True

    async def started_ranks(self) -> int:
        """How many ranks ``start`` started here (a cold restart starts them all again)."""
        return self.starts

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
            if sim.summary.done and sim.warm is None:  # a warm node serves until the group stops it
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

    def place(self, world: int, avoid_nodes: Sequence[str], extra: int = 0) -> list[NodePlace]:
        """The ranks on the first usable nodes, ``ranks_per_node`` each, then ``extra`` warm spares
        in the slots after them (a node of ranks and spares, or of spares only), as Ray packs
        one bundle per rank and spare (runmgr/workers/ray_node_agents.py)."""
        usable = [(self.hosts[i % len(self.hosts)], node) for i, node in enumerate(self.nodes)
                  if node not in avoid_nodes]
        if len(usable) * self.ranks_per_node < world + extra:
            raise ClusterError(f"{world} workers and {extra} spare(s) need {world + extra} slots; the simulated "
                               f"nodes outside the avoided ones hold {len(usable) * self.ranks_per_node}")
        places = []
        for first in range(0, world + extra, self.ranks_per_node):
            host, node = usable[first // self.ranks_per_node]
            self._serial += 1  # an old sub-run's stop never reaches the new one's node
            slots = range(first, min(first + self.ranks_per_node, world + extra))
            ranks = tuple(slot for slot in slots if slot < world)
            places.append(NodePlace(node, ranks, (host, f"{node}#{self._serial}"), spares=len(slots) - len(ranks)))
        return places

    def rendezvous(self, place: NodePlace) -> tuple[str, int]:
        return ("127.0.0.1", 0)  # simulated ranks meet nowhere

    def describe(self, place: NodePlace):
        host, key = place.where
        return host.describe.remote(key, place.node, place.ranks)

    def start(self, place: NodePlace, world: int, master: tuple[str, int], config: Any, plan: Any, rank_nodes: Any,
              inbox: Any, warm: Optional[WarmRun] = None):
        host, key = place.where
        return host.start.remote(key, place.node, place.ranks, config, plan, rank_nodes, inbox, warm)

    # What a warm group asks (runmgr/workers/warm_agents.py WarmAgents): one call per node, as
    # runmgr/workers/ray_node_agents.py makes of a real node's agent.
    def start_spares(self, place: NodePlace, count: int, buddy_offset: int) -> list[int]:
        host, key = place.where
        return ray.get(host.start_spares.remote(key, count))

    def waiting(self, places: Sequence[NodePlace]) -> set[int]:
        answers = ray.get([place.where[0].waiting.remote(place.where[1]) for place in places])
        return {rank for ranks in answers for rank in ranks}

    def regroup(self, place: NodePlace, subrun: str, named: dict[int, int], answers: dict[int, Any],
                rank_nodes: Optional[dict[int, str]]):
        host, key = place.where
        packed = {rank: PackedAnswer.of(answer) for rank, answer in answers.items()}  # as RayNodeAgents sends them
        at_step = next(iter(answers.values())).at_most if answers else None
        return host.regroup.remote(key, subrun, named, packed, rank_nodes, at_step)

    def probe(self, place: NodePlace) -> Any:
        host, key = place.where
        return host.waiting.remote(key)

    def collect(self, calls: list) -> list:
        return ray.get(calls)

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
