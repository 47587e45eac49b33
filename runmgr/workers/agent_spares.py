"""The warm spares of a group on node agents: forked processes, built and waiting, under the
agent of the node that holds them (runmgr/workers/node_agent.py ``start_spares``).

The retired per-rank design's pool asked each spare actor whether it was ready; here nobody is
asked: a spare's agent pushes ``spare`` items (:class:`SpareNews`) when
it is ready (it waits in its warm link, built) and when its process ended before it was named,
and the pool takes them from the group's polls. A spare that has not said it is ready within
the start timeout is given up (:meth:`AgentSparePool.give_up_late`), as the per-rank pool gives
up an actor not started in time: a fork has nothing to wait for, but a spare may hang while it
builds its model, and a spare never ready must not be counted on, nor waited on, forever.
Ray-free: the group starts the spares and ends those given up.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Callable, Optional

from runmgr.agents.device_slices import NoFreeDevices
from runmgr.agents.report import SpareNews
from runmgr.controller.group import SpareEvent, SpareEventKind, WorkerInfo
from runmgr.workers.agent_group import NodePlace
from runmgr.workers.spares import SPARE_RANK, spare_event

StartSpares = Callable[[NodePlace, int], list[int]]
"""Fork that many spares on the place's node; their keys there."""


@dataclass
class AgentSpare:
    """One spare process under a node's agent."""

    place: NodePlace
    key: int
    """Its key on its node (negative) until a recovery names its rank."""
    started_at: float = 0.0
    """When it was forked (on the pool's clock)."""
    ready: bool = False
    info: Optional[WorkerInfo] = None
    """Where it runs, once ready."""


class AgentSparePool:
    """The spares of one warm group on agents, never more than ``wanted``."""

    def __init__(self, wanted: int, start: StartSpares, start_timeout_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``start_timeout_s``: how long a spare may take to be ready (``controller.start_timeout_s``)."""
        self.wanted = wanted
        self.start = start
        self.start_timeout_s = start_timeout_s
        self.clock = clock
        self.spares: list[AgentSpare] = []

    def started(self, place: NodePlace, keys: list[int]) -> None:
        now = self.clock()
        self.spares += [AgentSpare(place, key, now) for key in keys]

    def give_up_late(self) -> list[tuple[AgentSpare, SpareEvent]]:
        """The spares not ready within the start timeout, no longer the pool's (the caller ends
        their processes), each with its ``spare_lost`` event."""
        now = self.clock()
        late = [spare for spare in self.spares if not spare.ready and now - spare.started_at > self.start_timeout_s]
        given_up = []
        for spare in late:
            self.spares.remove(spare)
            given_up.append((spare, self._event(
                "spare_lost", f"warm spare on node {spare.place.node} lost: it was not ready within "
                              f"{self.start_timeout_s:.0f} s of its start (it never said it waits to be named; "
                              f"controller.start_timeout_s), so its process is ended; it is not replaced")))
        return given_up

    def take_news(self, news: SpareNews) -> list[SpareEvent]:
        """A spare's agent said it is ready, or lost."""
        spare = next((s for s in self.spares if s.place.node == news.node and s.key == news.key), None)
        if spare is None:
            return []  # named or released since: not the pool's any more
        info = WorkerInfo(SPARE_RANK, news.pid, news.node_id, news.address)
        if news.kind == "ready":
            spare.ready, spare.info = True, info
            return [self._event("spare_ready", f"warm spare ready on node {news.node} (pid {news.pid})", info)]
        self.spares.remove(spare)
        why = news.text.strip().splitlines()[-1][:300] if news.text.strip() else "its process ended"
        return [self._event("spare_lost", f"warm spare on node {news.node} (pid {news.pid}) lost: {why}; it is not "
                                          f"replaced", info)]

    def ready(self) -> list[AgentSpare]:
        return [spare for spare in self.spares if spare.ready]

    def usable(self, avoid: Collection[str]) -> list[AgentSpare]:
        """Ready spares on no node of ``avoid`` (node names)."""
        return [spare for spare in self.ready() if spare.place.node not in avoid]

    def take(self, spares: list[AgentSpare]) -> None:
        """``spares`` become ranks: no longer the pool's."""
        self.spares = [spare for spare in self.spares if all(spare is not taken for taken in spares)]

    def refill(self, slots: list[tuple[NodePlace, int]]) -> list[SpareEvent]:
        """A new spare on each slot's node (``(place, rank)``: the node ``rank`` left when it took a
        spare), forked now and ready at a later poll; not refilled when its node has no device
        slice free for it."""
        events = []
        for place, rank in slots[:max(0, self.wanted - len(self.spares))]:
            try:
                keys = self.start(place, 1)
            except NoFreeDevices as refused:  # no hang, no start timeout: one spare fewer, said why
                events.append(self.not_refilled(f"no new warm spare on node {place.node} in the slot rank {rank} "
                                                f"left: {refused}"))
                continue
            self.started(place, keys)
            events.append(self._event("spare_refilling", f"a new warm spare starts on node {place.node} in the slot "
                                                         f"rank {rank} left, to replace the spare it took"))
        return events

    def not_refilled(self, why: str) -> SpareEvent:
        return self._event("spare_not_refilled", why)

    def not_placed(self, missing: int, avoided: Collection[str]) -> SpareEvent:
        """``missing`` spares the sub-run's placement had no room for beside the ranks, on the
        nodes left once ``avoided`` are left out: the run starts without them."""
        spares, them = ("warm spare", "it") if missing == 1 else ("warm spares", "them")
        return self._event("spare_not_started", f"{missing} {spares} not placed: the nodes the run may use without "
                                                f"{', '.join(avoided)} have no room for {them} beside the ranks; "
                                                f"the run goes on without {them}")

    def not_started(self, place: NodePlace, refused: NoFreeDevices) -> SpareEvent:
        """The spares placed on ``place``'s node that its agent did not fork (``refused``: its
        words, and the keys of those it forked before, which the caller keeps): the run starts
        without them, as a refill refused leaves one spare fewer."""
        missing = place.spares - len(refused.started)
        spares, them = ("warm spare", "it") if missing == 1 else ("warm spares", "them")
        return self._event("spare_not_started", f"{missing} {spares} placed on node {place.node} not started: "
                                                f"{refused}; the run goes on without {them}")

    def _event(self, kind: SpareEventKind, text: str, worker: Optional[WorkerInfo] = None) -> SpareEvent:
        return spare_event(kind, text, len(self.ready()), self.wanted, worker)
