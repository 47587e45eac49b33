"""The warm spares of a group on node agents: forked processes, built and waiting, under the
agent of the node that holds them (runmgr/workers/node_agent.py ``start_spares``).

The per-rank design's pool (runmgr/workers/spares.py) asks each spare actor whether it is
ready; here nobody is asked: a spare's agent pushes ``spare`` items (:class:`SpareNews`) when
it is ready (it waits in its warm link, built) and when its process ended before it was named,
and the pool takes them from the group's polls. Ray-free: the group starts the spares.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Callable, Optional

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
    ready: bool = False
    info: Optional[WorkerInfo] = None
    """Where it runs, once ready."""


class AgentSparePool:
    """The spares of one warm group on agents, never more than ``wanted``."""

    def __init__(self, wanted: int, start: StartSpares) -> None:
        self.wanted = wanted
        self.start = start
        self.spares: list[AgentSpare] = []

    def started(self, place: NodePlace, keys: list[int]) -> None:
        self.spares += [AgentSpare(place, key) for key in keys]

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
        spare), forked now and ready at a later poll."""
        events = []
        for place, rank in slots[:max(0, self.wanted - len(self.spares))]:
            self.started(place, self.start(place, 1))
            events.append(self._event("spare_refilling", f"a new warm spare starts on node {place.node} in the slot "
                                                         f"rank {rank} left, to replace the spare it took"))
        return events

    def not_refilled(self, why: str) -> SpareEvent:
        return self._event("spare_not_refilled", why)

    def _event(self, kind: SpareEventKind, text: str, worker: Optional[WorkerInfo] = None) -> SpareEvent:
        return spare_event(kind, text, len(self.ready()), self.wanted, worker)
