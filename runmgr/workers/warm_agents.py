"""A warm group on node agents: the ranks forked by one agent per node
(:class:`runmgr.workers.agent_group.AgentWorkerGroup`, which it holds), plus warm spares forked
under the agents (:class:`runmgr.workers.agent_spares.AgentSparePool`) and the ranks' snapshot
bookkeeping (:class:`runmgr.agents.snapshots.SnapshotLedger`), on every device kind (on
accelerators each spare holds devices of its own: runmgr/agents/device_slices.py). It does what
the retired per-rank warm group did, with calls per node instead of per rank:

- every rank trains with a warm link over its pipe (runmgr/agents/warm_link.py); a survivor's
  ``waiting`` and each rank's ``held`` snapshot step come pushed in the agents' reports;
- a spare is a process forked under the agent of its node: built, waiting; its agent pushes
  when it is ready or lost;
- a rank lost with its node is named as soon as a peer waits and its agent does not answer
  and its node's raylet takes no connection (runmgr/workers/liveness.py's probe, one call per
  node a poll, only while a peer waits: the agent answers for all its ranks), before Ray
  declares the node dead;
- a spare not ready within the start timeout is given up: its process is ended and the pool
  says so (``spare_lost``), as the per-rank pool gives up a spare actor not started in time;
- :meth:`recover` kills the lost ranks through their agents, waits until every survivor waits
  in its link (one ``waiting`` call per node), then tells each node at once (``regroup``, one
  call per node) which of its spares become which ranks and where the group re-forms. Once the
  re-formed group stepped, a new spare is forked in each slot a lost rank left.

docs/scale.md, "Warm spares on agents".
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Protocol, Sequence

from runmgr.agents.device_slices import NoFreeDevices
from runmgr.agents.report import SpareNews
from runmgr.agents.snapshots import HELD, HeldSnapshot, SnapshotLedger
from runmgr.agents.warm_link import WarmRun
from runmgr.controller.group import GroupPoll, SpareEvent, WarmRecoveryError, WarmStart, WorkerFailure, WorkerInfo
from runmgr.nodes import node_name
from runmgr.policy.warm import WarmCover, buddy_offset
from runmgr.workers.agent_group import AgentWorkerGroup, NodePlace
from runmgr.workers.agent_spares import AgentSpare, AgentSparePool
from runmgr.workers.liveness import PeerProbe, ProbeUnit
from runmgr.workers.warm_rules import SURVIVOR_WAIT_S, donor_of, slot_not_refilled, survivors_not_waiting
from trainer.config import TrainerConfig
from trainer.dist_env import DistEnv
from trainer.plan import ResumePlan
from trainer.rejoin import Rejoin, snapshot_holders



class WarmAgents(Protocol):
    """What a warm group asks of the node agents, besides what every agent group asks."""

    def rendezvous(self, place: NodePlace) -> tuple[str, int]: ...

    def start_spares(self, place: NodePlace, count: int, buddy_offset: int) -> list[int]: ...

    def waiting(self, places: Sequence[NodePlace]) -> set[int]: ...

    def regroup(self, place: NodePlace, subrun: str, named: dict[int, int], answers: dict[int, Any],
                rank_nodes: Optional[dict[int, str]]) -> Any: ...

    def collect(self, calls: list) -> list: ...

    def probe(self, place: NodePlace) -> Any:
        """The lost-node probe's call to ``place``'s node (not waited for): the ranks there that
        wait in their warm link; no answer while the node is gone."""

    def kill_rank(self, place: NodePlace, rank: int) -> None: ...


@dataclass
class Refill:
    """Slots a warm restart freed (``(place, rank)``), for new spares once the re-formed group has
    stepped past ``after_step``."""

    after_step: int
    slots: list[tuple[NodePlace, int]]


class WarmAgentGroup:
    """The ranks on agents plus ready spares; recovers a lost rank in place."""

    def __init__(self, ranks: AgentWorkerGroup, agents: WarmAgents, warm_spares: int,
                 probe: Optional[PeerProbe] = None, clock: Callable[[], float] = time.monotonic) -> None:
        """``probe``: names the ranks lost with their node before Ray does (None: a new one);
        a spare not ready within the ranks' ``start_timeout_s`` on ``clock`` is given up."""
        self.ranks = ranks
        self._probe = probe if probe is not None else PeerProbe()
        self.agents = agents
        self.warm_spares = warm_spares
        self._offset = 1
        self._ledger = SnapshotLedger()
        self._pool = AgentSparePool(warm_spares, lambda place, count: agents.start_spares(place, count, self._offset),
                                    ranks.start_timeout_s, clock)
        self._refill: Optional[Refill] = None
        self._events: list[SpareEvent] = []
        self._config: Optional[TrainerConfig] = None
        ranks.side_kinds = frozenset({HELD, "spare"})

    @property
    def workers(self) -> list[WorkerInfo]:
        return self.ranks.workers

    @property
    def world_size(self) -> int:
        return self.ranks.world_size

    def start(self, config: TrainerConfig, plan: ResumePlan) -> list[WorkerInfo]:
        self._config = config
        workers = self.ranks.start(config, plan, extra=self.warm_spares, warm=lambda nodes: self._warm_run(config, nodes))
        placed = sum(place.spares for place in self.ranks.places)
        if placed < self.warm_spares:  # the nodes left after a loss hold the ranks, not every spare
            self._events.append(self._pool.not_placed(self.warm_spares - placed, plan.avoid_nodes))
        for place in self.ranks.places:
            if place.spares:
                self._start_spares(place)
        return workers

    def _start_spares(self, place: NodePlace) -> None:
        """The spares placed on ``place``'s node, forked by its agent. Those it refuses (no free
        device slice: Ray gave it fewer device ids than it counted) are a ``spare_not_started``
        event in the agent's words at the next poll, and the run starts without them: the
        ranks are placed and forked by then, and a spare short is a warm restart less, not a
        reason to stop (a later fault restarts cold unless a spare is ready)."""
        try:
            keys = self.agents.start_spares(place, place.spares, self._offset)
        except NoFreeDevices as refused:
            self._pool.started(place, refused.started)
            self._events.append(self._pool.not_started(place, refused))
            return
        self._pool.started(place, keys)

    def _warm_run(self, config: TrainerConfig, rank_nodes: dict[int, str]) -> WarmRun:
        """How the ranks run warm, placed on ``rank_nodes``: buddies on other nodes where there are."""
        self._offset = buddy_offset([rank_nodes[rank] for rank in sorted(rank_nodes)])
        live = config.layout(len(rank_nodes)).plain  # a replica's live state serves (trainer/live.py)
        self._ledger = SnapshotLedger(live)
        return WarmRun(self._offset, live)

    def poll(self, timeout_s: float) -> GroupPoll:
        self._send_probes()  # armed only once a survivor waits: no call while all goes well
        poll = self.ranks.poll(timeout_s)
        if poll.waiting_ranks:
            self._probe.arm(poll.waiting_ranks)
            self._send_probes()
        if not poll.failures:
            self._find_unreachable(poll)
        events, self._events = self._events, []
        for kind, item in self.ranks.take_side_items():
            if kind == HELD and isinstance(item, HeldSnapshot):
                self._ledger.hold(item)
            elif isinstance(item, SpareNews):
                events += self._pool.take_news(item)
        for spare, event in self._pool.give_up_late():  # never waited on forever
            self.agents.kill_rank(spare.place, spare.key)
            events.append(event)
        if poll.steps:  # rank 0 reports a step it committed
            self._ledger.committed(poll.steps[-1].step)
        if self._refill is not None and any(report.step > self._refill.after_step for report in poll.steps):
            refill, self._refill = self._refill, None
            events += self._pool.refill(refill.slots)
        poll.spare_events += events
        poll.ready_spares = len(self._pool.ready())
        return poll

    def _send_probes(self) -> None:
        """One probe per node with running ranks, its agent answering for them all."""
        if not self._probe.armed:
            return
        places: dict[str, NodePlace] = {}
        ranks: dict[str, list[int]] = defaultdict(list)
        for rank in sorted(self.ranks.running):
            place = self.ranks.place_of(rank)
            places.setdefault(place.node, place)
            ranks[place.node].append(rank)
        self._probe.send({node: ProbeUnit(tuple(ranks[node]), lambda place=place: self.agents.probe(place))
                                for node, place in places.items()})

    def _find_unreachable(self, poll: GroupPoll) -> None:
        """Ranks lost with their node, named while their peers wait for them (liveness.py)."""
        workers = self.ranks.workers
        for rank, text in self._probe.check(workers).unreachable.items():
            poll.failures.append(WorkerFailure(rank, "died", text, workers[rank], time.time()))
            self.ranks.lose(rank)

    def warm_cover(self) -> WarmCover:
        nodes = {info.rank: node_name(info.node_id) for info in self.ranks.workers}
        holders = self._holder_nodes(nodes)
        spares: dict[str, int] = defaultdict(int)
        for spare in self._pool.ready():
            spares[spare.place.node] += 1
        known = [step for step in (self._ledger.step_of(rank) for rank in nodes) if step is not None]
        return WarmCover(max(known) if known else None, nodes, holders, dict(spares))

    def _holder_nodes(self, nodes: dict[int, str]) -> dict[int, tuple[str, ...]]:
        """The nodes that hold each rank's snapshot. In plain data parallel every replica holds
        the whole state, so every rank's holders are every node: one tuple for all, not the
        world's ranks walked once per rank (0.43 CPU-s a decision at 2,048 ranks; about 27 at
        16,384 by the square: bench/scale.py's warm arm, docs/scale.md)."""
        assert self._config is not None
        if self._config.layout(self.ranks.world_size).plain:
            everywhere = tuple(dict.fromkeys(nodes[rank] for rank in sorted(nodes)))
            return dict.fromkeys(nodes, everywhere)
        return {rank: tuple(dict.fromkeys(nodes[holder] for holder in self._holders(rank))) for rank in nodes}

    def _holders(self, rank: int) -> tuple[int, ...]:
        assert self._config is not None
        return snapshot_holders(rank, self._config.layout(self.ranks.world_size), self._offset)

    def recover(self, config: TrainerConfig, plan: ResumePlan, warm: WarmStart) -> list[WorkerInfo]:
        world = self.ranks.world_size
        lost = sorted(set(warm.ranks))
        survivors = [rank for rank in range(world) if rank not in lost]
        spares = self._pool.usable(warm.avoid_nodes)[:len(lost)]
        if len(spares) < len(lost) or not survivors:
            raise WarmRecoveryError(f"{len(spares)} ready spare(s) off the avoided nodes for {len(lost)} lost rank(s)")
        donors = {rank: self._donor(rank, set(lost)) for rank in lost}
        freed = [(self.ranks.place_of(rank), rank) for rank in lost]
        for rank in lost:  # a rank on an excluded node may still live
            self.ranks.kill(rank)
        self._wait_for_survivors(survivors)
        self._pool.take(spares)
        places = {rank: self.ranks.place_of(rank) for rank in survivors}
        places.update({rank: spare.place for rank, spare in zip(lost, spares)})
        master, port = self.agents.rendezvous(places[0])
        answers = {rank: Rejoin(DistEnv(rank, world, 0, master, port), plan, donors, warm.step) for rank in range(world)}
        self._regroup(plan.subrun, places, dict(zip(lost, spares)), answers)
        self._plan_refill(warm, freed)
        self._probe.reset()
        self._ledger.clear()
        return self.workers

    def _regroup(self, subrun: str, places: dict[int, NodePlace], named: dict[int, AgentSpare],
                 answers: dict[int, Rejoin]) -> None:
        """One call per node: its spares named, its ranks answered."""
        by_node: dict[str, list[int]] = defaultdict(list)
        for rank, place in places.items():
            by_node[place.node].append(rank)
        rank_nodes = {rank: place.node for rank, place in places.items()}
        calls = []
        for node, node_ranks in by_node.items():
            place = places[node_ranks[0]]
            keys = {named[rank].key: rank for rank in node_ranks if rank in named}
            calls.append((place, self.agents.regroup(place, subrun, keys, {rank: answers[rank] for rank in node_ranks},
                                                     rank_nodes if 0 in node_ranks else None)))
        adopted = self.agents.collect([ref for _, ref in calls])
        self.ranks.regrouped(subrun)
        for (place, _), infos in zip(calls, adopted):
            for info in infos:
                self.ranks.adopt(info, place)

    def _donor(self, rank: int, lost: set[int]) -> int:
        """A survivor that holds ``rank``'s snapshot."""
        return donor_of(rank, self._holders(rank), lost)

    def _wait_for_survivors(self, survivors: list[int]) -> None:
        """Until every survivor waits in its warm link (its collective failed): answering one
        still inside a collective would leave it in the old group. One call per node a round."""
        deadline = time.monotonic() + SURVIVOR_WAIT_S
        pending = set(survivors)
        while pending:
            places = {self.ranks.place_of(rank).node: self.ranks.place_of(rank) for rank in pending}
            pending -= self.agents.waiting(list(places.values()))
            if pending and time.monotonic() > deadline:
                raise survivors_not_waiting(pending, SURVIVOR_WAIT_S)
            if pending:
                time.sleep(0.005)

    def _plan_refill(self, warm: WarmStart, freed: list[tuple[NodePlace, int]]) -> None:
        """New spares for the slots the lost ranks left, once the group has stepped; a slot on a
        node the plan avoids is not used (fewer spares: a further fault restarts cold)."""
        usable = [(place, rank) for place, rank in freed if place.node not in warm.avoid_nodes]
        for place, rank in freed:
            if place.node in warm.avoid_nodes:
                self._events.append(self._pool.not_refilled(slot_not_refilled(rank, place.node)))
        if usable:
            self._refill = Refill(warm.step, usable)

    def kill(self, rank: int) -> None:
        self.ranks.kill(rank)

    def dump_stacks(self, out_dir: Path) -> list[Path]:
        return self.ranks.dump_stacks(out_dir)

    def shutdown(self) -> None:
        self._refill = None
        self._pool.take(list(self._pool.spares))  # their agents stop them with the ranks
        self.ranks.shutdown()
