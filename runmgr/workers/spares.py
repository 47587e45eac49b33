"""A warm group's spares: started with the ranks or after a warm restart used one, counted
ready only once they wait to be named, and handed to a recovery.

A spare is an actor running ``run_spare`` (trainer/loop.py's ``train_spare``): it builds the
model and the optimizer and pays the first step's imports, then waits in its warm link. Only
then is it *ready*, and only ready spares are offered: the policy's
:class:`runmgr.policy.warm.WarmCover` never counts one still starting. The pool never blocks
the driver: a call an actor does not answer at once is collected at a later poll.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Callable, Optional

import ray
from ray.exceptions import RayActorError, RayTaskError

from runmgr.controller.group import SpareEvent, SpareEventKind, WorkerInfo
from runmgr.nodes import node_name

SPARE_RANK = -1
"""The rank a spare's actor holds until a recovery names the one it replaces."""


@dataclass(frozen=True)
class Slot:
    """Where one actor of the group is placed: its scheduling strategy (a bundle of the group's
    placement group, or a node) and the node that holds it."""

    strategy: Any
    node_id: str


@dataclass
class Spare:
    """One spare actor and how far it got."""

    actor: Any
    strategy: Any
    """Where it was placed (:class:`Slot`'s strategy): the rank it becomes keeps it."""
    run: Any
    """``run_spare``'s result: it comes back only when the spare dies or is released."""
    asked_at: float
    info: Optional[WorkerInfo] = None
    """Where its actor runs; None until the actor has started."""
    describing: Any = None
    """The pending ``describe`` of an actor not yet started."""
    probe: Any = None
    """The pending ``waiting`` call of a spare not yet ready."""
    ready: bool = False
    """Its actor started and its ``run_spare`` waits to be named."""


class SparePool:
    """The spares of one warm group, never more than ``wanted``."""

    def __init__(self, wanted: int, create: Callable[[Any], Any], launch: Callable[[Any], Any],
                 start_timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        """``create(strategy)``: a new spare actor placed so; ``launch(actor)``: its ``run_spare``'s
        result; a spare not started within ``start_timeout_s`` is given up."""
        self.wanted = wanted
        self.create = create
        self.launch = launch
        self.start_timeout_s = start_timeout_s
        self.clock = clock
        self.spares: list[Spare] = []

    def add_started(self, actors: list, strategies: list, infos: list[WorkerInfo]) -> None:
        """Spares whose actors have started (the group's launch waited for them): they train as spares now."""
        for actor, strategy, info in zip(actors, strategies, infos):
            self.spares.append(Spare(actor, strategy, self.launch(actor), self.clock(), info))

    def refill(self, slots: list[Slot], ranks: list[int]) -> list[SpareEvent]:
        """Start a spare in each of ``slots`` (the one ``ranks[i]`` left when it took a spare), in
        the background: they are ready at a later :meth:`poll`."""
        events = []
        for slot, rank in list(zip(slots, ranks))[:max(0, self.wanted - len(self.spares))]:
            actor = self.create(slot.strategy)
            spare = Spare(actor, slot.strategy, self.launch(actor), self.clock(), describing=actor.describe.remote())
            self.spares.append(spare)
            events.append(self._event("spare_refilling", f"a new warm spare starts on node {node_name(slot.node_id)} "
                                                         f"in the slot rank {rank} left, to replace the spare it "
                                                         f"took"))
        return events

    def not_refilled(self, why: str) -> SpareEvent:
        """A spare a recovery took that will not be replaced, and why."""
        return self._event("spare_not_refilled", why)

    def poll(self) -> list[SpareEvent]:
        """What changed since the last poll: spares started, ready, or lost."""
        events = self._collect_starts()
        events += self._collect_ends()
        events += self._collect_readiness()
        return events

    def ready(self) -> list[Spare]:
        return [spare for spare in self.spares if spare.ready]

    def usable(self, avoid: Collection[str]) -> list[Spare]:
        """Ready spares on no node of ``avoid`` (node names)."""
        return [spare for spare in self.ready() if node_name(spare.info.node_id) not in avoid]

    def take(self, spares: list[Spare]) -> None:
        """``spares`` become ranks: no longer the pool's."""
        self.spares = [spare for spare in self.spares if all(spare is not taken for taken in spares)]

    def shutdown(self) -> None:
        for spare in self.spares:
            ray.kill(spare.actor, no_restart=True)
        self.spares = []

    def _collect_starts(self) -> list[SpareEvent]:
        starting = [spare for spare in self.spares if spare.describing is not None]
        answered = _answered([spare.describing for spare in starting])
        events = []
        for spare in starting:
            if spare.describing in answered:
                try:
                    spare.info, spare.describing = ray.get(spare.describing), None
                except RayActorError as exc:
                    events.append(self._lose(spare, f"its actor died as it started ({_first_line(exc)})"))
            elif self.clock() - spare.asked_at > self.start_timeout_s:
                events.append(self._lose(spare, f"its actor did not start within {self.start_timeout_s:.0f} s "
                                                f"(no room for it on its node?)"))
        return events

    def _collect_ends(self) -> list[SpareEvent]:
        """A spare's ``run_spare`` returns only when it died (or was released)."""
        ended = _answered([spare.run for spare in self.spares])
        events = []
        for spare in [spare for spare in self.spares if spare.run in ended]:
            try:
                result = ray.get(spare.run)
            except (RayActorError, RayTaskError) as exc:
                events.append(self._lose(spare, _first_line(exc)))
            else:
                events.append(self._lose(spare, f"it ended ({result.get('result')})"))
        return events

    def _collect_readiness(self) -> list[SpareEvent]:
        started = [spare for spare in self.spares if spare.info is not None and not spare.ready]
        answered = _answered([spare.probe for spare in started if spare.probe is not None])
        events = []
        for spare in started:
            if spare.probe is None:
                spare.probe = spare.actor.waiting.remote()
            elif spare.probe in answered:
                probe, spare.probe = spare.probe, None
                try:
                    spare.ready = ray.get(probe)
                except RayActorError:
                    continue  # dead: its run_spare says why at the next poll
                if spare.ready:
                    events.append(self._event("spare_ready", f"warm spare ready on node "
                                                             f"{node_name(spare.info.node_id)} (pid {spare.info.pid})",
                                              spare.info))
        return events

    def _lose(self, spare: Spare, why: str) -> SpareEvent:
        ray.kill(spare.actor, no_restart=True)
        self.spares.remove(spare)
        where = f" on node {node_name(spare.info.node_id)} (pid {spare.info.pid})" if spare.info else ""
        return self._event("spare_lost", f"warm spare{where} lost: {why}; it is not replaced", spare.info)

    def _event(self, kind: SpareEventKind, text: str, worker: Optional[WorkerInfo] = None) -> SpareEvent:
        return spare_event(kind, text, len(self.ready()), self.wanted, worker)


def spare_event(kind: SpareEventKind, text: str, ready: int, wanted: int,
                worker: Optional[WorkerInfo] = None) -> SpareEvent:
    """A change of a warm group's spares, worded with how many are ready (both designs' pools)."""
    return SpareEvent(kind, f"{text} ({ready} of {wanted} ready)", ready, wanted, worker)


def _answered(refs: list) -> set:
    """Those of ``refs`` whose answer is back, without waiting."""
    if not refs:
        return set()
    done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
    return set(done)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__
