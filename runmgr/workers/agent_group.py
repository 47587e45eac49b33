"""The ranks of one sub-run owned by one agent per node: the driver's cost grows with nodes.

:class:`AgentWorkerGroup` is a :class:`runmgr.controller.group.WorkerGroup` like
:class:`runmgr.workers.group.RayWorkerGroup`, and the controller cannot tell them apart. Where
the per-rank group makes one remote call per rank per poll, this one makes one: it drains the
:class:`runmgr.workers.inbox.ReportInbox` its nodes' agents push to, and waits on one object per
agent (an agent whose process dies takes its node's ranks with it). The agents
(:class:`NodeAgents`) start their node's ranks, hear them, sum them up
(runmgr/agents/summary.py), and kill or stop them when told.

The agents are the scale harness's simulated nodes (runmgr/scale/agent_hosts.py), or real ones
that fork the trainer's ranks (runmgr/workers/node_agent.py), which a launch of the built-in
trainer uses without warm spares, on CPU and accelerator nodes, and with them on CPU nodes, where
a warm run's group holds this one (runmgr/workers/warm_agents.py; runmgr/runners.py; docs/scale.md).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Protocol

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from runmgr import cluster as ray_cluster
from runmgr.agents.report import NodeReport, RankEnd
from runmgr.agents.warm_link import WarmRun
from runmgr.controller.group import GroupPoll, WorkerFailure, WorkerInfo
from runmgr.errors import ClusterError, ClusterLostError
from runmgr.watch.observations import StepObservation
from runmgr.workers.inbox import KeptInbox, inbox_beside_driver
from trainer.config import TrainerConfig
from trainer.plan import ResumePlan

FAILURE_SETTLE_S = 1.0
"""After the first failure, how long the other agents are given to report theirs, so that the
root cause (a dead process) wins over its echo (a peer's broken collective)."""
START_TIMEOUT_S = 120.0
"""How long the ranks of a sub-run may take to be forked and described."""
ERROR_LINES = 3
"""A rank that raised is told by the last lines of its traceback, as a rank actor's error is."""


@dataclass(frozen=True)
class NodePlace:
    """One node of a sub-run: its name and the ranks its agent owns."""

    node: str
    ranks: tuple[int, ...]
    where: object
    """What the :class:`NodeAgents` need to reach the node's agent."""
    spares: int = 0
    """Warm spares placed on the node beside its ranks (a node may hold spares only)."""


class NodeAgents(Protocol):
    """Where a group's node agents come from and what they are asked."""

    def place(self, world: int, avoid_nodes: Sequence[str]) -> list[NodePlace]:
        """Nodes for ``world`` ranks off ``avoid_nodes``; a ClusterError when there are too few."""

    def rendezvous(self, place: NodePlace) -> tuple[str, int]:
        """Where the ranks' process groups meet: an address of ``place``'s node (rank 0's) and a
        free port on it."""

    def start(self, place: NodePlace, world: int, master: tuple[str, int], config: object, plan: object,
              rank_nodes: object, inbox: object) -> object:
        """Start the node's ranks of ``world``, meeting at ``master``, their reports pushed to
        ``inbox``; an object ref that resolves when they have all ended, and fails when the agent
        dies. ``config``, ``plan``: object refs of the sub-run's TrainerConfig and ResumePlan;
        ``rank_nodes``: of every rank's node, for the node of rank 0 (None elsewhere)."""

    def describe(self, place: NodePlace) -> object:
        """An object ref of the node's ranks' :class:`WorkerInfo` list, once started."""

    def kill_rank(self, place: NodePlace, rank: int) -> None:
        """End ``rank`` now (its end is reported as a death)."""

    def dump_stacks(self, place: NodePlace) -> dict[int, str]:
        """``{rank: text}``: the Python stacks of the node's ranks, dumped where they run."""

    def stop(self, place: NodePlace) -> None:
        """End the node's ranks; they report nothing more."""

    def release(self) -> None:
        """Free what placing the sub-run's nodes held, once they are all stopped."""


class AgentWorkerGroup:
    """One agent per node, one drain per poll."""

    def __init__(self, agents: NodeAgents, default_world: int, settle_s: float = FAILURE_SETTLE_S,
                 start_timeout_s: float = START_TIMEOUT_S, inbox: Optional[KeptInbox] = None) -> None:
        """``default_world``: the ranks of a plan that names no data-parallel size;
        ``start_timeout_s``: how long the ranks may take to start (then a ClusterError);
        ``inbox``: the launch's inbox, kept across its sub-runs (None: one of the group's own)."""
        self.agents = agents
        self.default_world = default_world
        self.settle_s = settle_s
        self.start_timeout_s = start_timeout_s
        self._places: list[NodePlace] = []
        self._place_of: dict[int, NodePlace] = {}
        self._infos: list[WorkerInfo] = []
        self._runs: dict = {}
        """Each agent's object ref (resolves when its ranks ended), to its node."""
        self._running: set[int] = set()
        self._kept_inbox = inbox
        self._inbox = None
        self._subrun = ""
        """The sub-run whose reports the group takes: a kept inbox may still hold an earlier one's."""
        self.side_kinds: frozenset[str] = frozenset()
        """Report kinds the group keeps aside for whoever holds it (:meth:`take_side_items`)."""
        self.side_items: list[tuple[str, object]] = []

    @property
    def workers(self) -> list[WorkerInfo]:
        return list(self._infos)

    @property
    def world_size(self) -> int:
        return len(self._infos)

    @property
    def places(self) -> list[NodePlace]:
        """The sub-run's nodes (those holding only spares included)."""
        return list(self._places)

    def place_of(self, rank: int) -> NodePlace:
        return self._place_of[rank]

    def start(self, config: TrainerConfig, plan: ResumePlan, extra: int = 0,
              warm: Optional[Callable[[dict[int, str]], WarmRun]] = None) -> list[WorkerInfo]:
        """Place the ranks and room for ``extra`` spares (:attr:`NodePlace.spares`) and start
        training; ``warm(rank_nodes)``: how the ranks run warm, from where they were placed."""
        ray_cluster.check_head()  # placing ranks needs the head: without it Ray waits until it ends the driver
        world = config.world_size_of(plan.data_parallel_size) if plan.data_parallel_size else self.default_world
        self._places = (self.agents.place(world, plan.avoid_nodes, extra) if extra
                        else self.agents.place(world, plan.avoid_nodes))
        self._place_of = {rank: place for place in self._places for rank in place.ranks}
        rank_nodes = {rank: place.node for rank, place in self._place_of.items()}
        self._subrun = plan.subrun
        self._inbox = self._kept_inbox.actor() if self._kept_inbox is not None else inbox_beside_driver()
        try:
            master = self.agents.rendezvous(self._place_of[0])
            # Stored once, not serialised once per node; only rank 0's node sums step reports up per node.
            config_ref, plan_ref, nodes_ref = ray.put(config), ray.put(plan), ray.put(rank_nodes)
            warm_run = warm(rank_nodes) if warm is not None else None
            self._runs = {self._start_node(place, world, master, config_ref, plan_ref,
                                           nodes_ref if 0 in place.ranks else None, warm_run): place
                          for place in self._places}
            described = ray_cluster.get_while_head_lives([self.agents.describe(place) for place in self._places],
                                                         self.start_timeout_s)
        except GetTimeoutError:
            self.shutdown()
            raise ClusterError(f"the ranks of {len(self._places)} node(s) did not start within "
                               f"{self.start_timeout_s:.0f} s (free resources: {ray.available_resources()})") from None
        except RayActorError as exc:  # an agent died before its ranks started: a failed launch, for the policy
            self.shutdown()
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ClusterError(f"a node agent died before its ranks started ({first})") from None
        self._infos = sorted((info for infos in described for info in infos), key=lambda info: info.rank)
        self._running = set(range(world))
        return self.workers

    def _start_node(self, place: NodePlace, world: int, master: tuple[str, int], config: object, plan: object,
                    rank_nodes: object, warm: Optional[WarmRun]) -> object:
        if warm is None:  # the simulated agents know nothing of warm runs
            return self.agents.start(place, world, master, config, plan, rank_nodes, self._inbox)
        return self.agents.start(place, world, master, config, plan, rank_nodes, self._inbox, warm)

    def adopt(self, info: WorkerInfo, place: NodePlace) -> None:
        """A spare on ``place``'s node became ``info.rank`` (a warm recovery): it runs, its reports
        and end are the rank's (an end of the process it replaced is ignored, by pid)."""
        self._infos[info.rank] = info
        self._place_of[info.rank] = place
        self._running.add(info.rank)

    def lose(self, rank: int) -> None:
        """``rank`` was named lost by its holder (with its node): its end is not waited for."""
        self._running.discard(rank)

    @property
    def running(self) -> set[int]:
        """The ranks not ended yet."""
        return set(self._running)

    def regrouped(self, subrun: str) -> None:
        """The ranks re-formed warm as ``subrun``: its reports are the ones taken from now on."""
        self._subrun = subrun

    def poll(self, timeout_s: float) -> GroupPoll:
        result = GroupPoll()
        if self._runs:  # ranks still training need the cluster; ranks that all ended are judged as they ended
            ray_cluster.check_head()
        self._take(self._drain(timeout_s), result)
        self._check_agents(result)
        deadline = time.monotonic() + self.settle_s
        while result.failures and self._running and time.monotonic() < deadline:
            self._take(self._drain(deadline - time.monotonic()), result)
        return result

    def _drain(self, wait_s: float) -> list[NodeReport]:
        try:
            return ray.get(self._inbox.drain.remote(wait_s))
        except RayActorError as exc:  # it runs on the driver's node: that node's Ray is going
            raise ClusterLostError(f"the report inbox on the driver's node died ({_first_line(exc)}); run the same "
                                   f"`runmgr launch` again to resume from the last verified checkpoint") from None

    def _take(self, reports: list[NodeReport], result: GroupPoll) -> None:
        for report in reports:
            result.devices.extend(report.devices)  # a node's devices belong to no sub-run
            if report.subrun != self._subrun:
                continue  # pushed late by a stopped sub-run's agent into the kept inbox
            for kind, item in report.items:
                if kind in self.side_kinds:
                    self.side_items.append((kind, item))
                else:
                    self._take_item(kind, item, result)
            if report.beat is not None:
                result.node_beats.append(report.beat)
            for end in report.ended:
                self._take_end(end, result)
        result.steps.sort(key=lambda r: r.step)
        result.devices.sort(key=lambda r: r.time)

    def _take_item(self, kind: str, item: object, result: GroupPoll) -> None:
        if kind == "step":
            result.steps.append(item)
            result.observations.append(StepObservation.from_report(item))
        elif kind == "timings":
            result.observations.append(item)
        else:
            {"checkpoint": result.checkpoints, "started": result.starts, "local_norms": result.local_norms,
             "waiting": result.waiting_ranks, "heartbeat": result.heartbeats, "pause": result.pause_beats}[kind].append(item)

    def take_side_items(self) -> list[tuple[str, object]]:
        """The items of :attr:`side_kinds` the polls met since the last call (a warm group's)."""
        items, self.side_items = self.side_items, []
        return items

    def _take_end(self, end: RankEnd, result: GroupPoll) -> None:
        if end.rank not in self._running:
            return  # stopped on purpose, or already reported
        info = self._info(end.rank)
        if end.pid is not None and info is not None and end.pid != info.pid:
            return  # the process a warm recovery replaced, killed: not the rank's end
        self._running.discard(end.rank)
        if end.kind == "finished":
            result.finished_ranks.append(end.rank)
        else:
            text = _last_lines(end.text, ERROR_LINES) if end.kind == "error" else end.text
            result.failures.append(WorkerFailure(end.rank, end.kind, text, self._info(end.rank), end.time,
                                                 end.exit_code))

    def _check_agents(self, result: GroupPoll) -> None:
        """An agent that died took its node's ranks with it: those it still holds. A rank a warm
        recovery moved to a spare on another node is no longer its (the lost-node probe named the
        node lost first, and Ray declares the node's agent dead only later)."""
        if not self._runs:
            return
        done, _ = ray.wait(list(self._runs), num_returns=len(self._runs), timeout=0)
        for ref in done:
            place = self._runs.pop(ref)
            try:
                ray.get(ref)
            except RayActorError as exc:
                text = f"the agent of node {place.node} died: {_first_line(exc)}"
                for rank in place.ranks:
                    if self._place_of[rank].node == place.node:
                        self._take_end(RankEnd(rank, "died", text, time.time()), result)

    def _info(self, rank: int) -> Optional[WorkerInfo]:
        return self._infos[rank] if rank < len(self._infos) else None

    def kill(self, rank: int) -> None:
        """End ``rank`` now."""
        self.agents.kill_rank(self._place_of[rank], rank)

    def dump_stacks(self, out_dir: Path) -> list[Path]:
        """Every rank's stack into ``out_dir/rank<N>.txt``, each dumped by its node's agent."""
        out_dir.mkdir(parents=True, exist_ok=True)
        written = []
        for place in self._places:
            for rank, text in sorted(self.agents.dump_stacks(place).items()):
                target = out_dir / f"rank{rank}.txt"
                target.write_text(text)
                written.append(target)
        return written

    def shutdown(self) -> None:
        for place in self._places:
            self.agents.stop(place)
        if self._places:
            self.agents.release()
        if self._inbox is not None and self._kept_inbox is None:
            ray.kill(self._inbox, no_restart=True)
        self._places, self._place_of, self._runs, self._running, self._inbox = [], {}, {}, set(), None


def _last_lines(text: str, count: int) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return "\n".join(lines[-count:])


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__
