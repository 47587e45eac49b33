"""Ranks lost with their node, named before Ray declares the node dead.

Ray reports a dead actor on a live node at once (its raylet tells), but a whole node only
when it has missed its health checks (2.1-2.8 s with a local Ray here, longer on a real
cluster). The lost rank's peers know within ~0.05 s: their collective fails and they wait in
their warm link (trainer/warm.py). A rank is named lost when three things hold together:

- a survivor waits in its warm link: a peer broke the group. A slow rank breaks nothing: its
  peers wait inside the collective, not in the link, and nobody is probed;
- the rank's agent has not answered a liveness probe (``waiting``) for ``probe_s``;
- its node's raylet takes no TCP connection: refused (the raylet's process is gone), or not
  within ``connect_s`` (the node is cut off). A live node passes this whatever its load (the
  kernel accepts the connection for the raylet), so a rank that is only busy or starved is
  never named here: it is left to Ray and to the watcher (a hang).

The probes are ``waiting`` calls. A probe goes to a *unit* (:class:`ProbeUnit`): a node's
agent, which answers for all its ranks at once (runmgr/workers/node_agent.py ``waiting``: one
call per node, so a recovery's probes grow with the nodes, not the ranks). The answers are
kept and judged per rank. None is sent while all goes well (each call costs the
ranks' CPU, which on a busy node is the steps' time): a rank's drain says when it waits in its
warm link (:meth:`PeerProbe.arm`), and from then on the warm group sends one to each unit at
the start of a poll and before its drain, and checks after the wait for the ranks' outcomes
and after the drain (which waits up to 0.5 s for a rank that never answers), so a lost node is
named within about two polls of its peers' noticing it.

How the calls' answers are awaited is :class:`Answers` (Ray's ``wait`` and ``get``; a test's
in-process fakes), so the probe's rules run without a cluster.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol

import ray
from ray.exceptions import ActorUnavailableError, RayActorError

from runmgr.controller.group import WorkerInfo
from runmgr.nodes import node_name
from runmgr.watch.deaths import NODE_UNREACHABLE

PROBE_S = 0.3
"""How long a rank's actor may leave a liveness probe unanswered before its node is checked."""
CONNECT_S = 0.3
"""How long a node's raylet may take to accept a TCP connection."""

Raylets = Callable[[], Mapping[str, tuple[str, int]]]
"""Every node's raylet address (host, port), by node id."""


def ray_raylets() -> dict[str, tuple[str, int]]:
    """The raylet of every node Ray knows, by node id."""
    return {node["NodeID"]: (node["NodeManagerAddress"], int(node["NodeManagerPort"])) for node in ray.nodes()}


def silent_ranks(waiting: Collection[int], unanswered_s: Mapping[int, float], probe_s: float) -> list[int]:
    """The ranks to check: while any rank of ``waiting`` waits in its warm link, those whose
    probe has gone unanswered for ``probe_s`` (``unanswered_s``: by rank, how long so far)."""
    if not waiting:
        return []
    return sorted(rank for rank, seconds in unanswered_s.items() if seconds >= probe_s and rank not in waiting)


def raylet_refusal(host: str, port: int, timeout_s: float) -> Optional[str]:
    """Why the raylet at ``host:port`` takes no TCP connection within ``timeout_s``; None when it takes one."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as exc:  # refused, unreachable or timed out: exactly what is asked
        return exc.strerror or type(exc).__name__


class Answers(Protocol):
    """How the probe awaits its calls' answers."""

    def ready(self, calls: list, timeout_s: float) -> list:
        """Those of ``calls`` answered within ``timeout_s`` (0: those answered already)."""

    def value(self, call: Any) -> Any:
        """``call``'s answer; raises what the call raised."""


class RayAnswers:
    """The answers of Ray calls (object refs)."""

    def ready(self, calls: list, timeout_s: float) -> list:
        done, _ = ray.wait(calls, num_returns=len(calls), timeout=timeout_s)
        return done

    def value(self, call: Any) -> Any:
        return ray.get(call)


@dataclass(frozen=True)
class ProbeUnit:
    """What one probe call asks, and about which ranks: a node's agent, answering for its
    running ranks with those that wait in their warm link."""

    ranks: tuple[int, ...]
    ask: Callable[[], Any]
    """Sends the call; what :class:`Answers` awaits."""

    def waiting(self, answer: Any) -> set[int]:
        """The ranks of this unit that ``answer`` says wait in their warm link."""
        return set(answer) & set(self.ranks)


@dataclass(frozen=True)
class ProbeResult:
    """What one check found."""

    waiting: tuple[int, ...] = ()
    """Ranks waiting in their warm link for the group to re-form."""
    silent: tuple[int, ...] = ()
    """Ranks whose probe went unanswered for ``probe_s`` while others wait."""
    unreachable: dict[int, str] = field(default_factory=dict)
    """Silent ranks whose node's raylet takes no connection: the failure's text, by rank."""


class PeerProbe:
    """Probes a group's ranks at every poll and names those lost with their node."""

    def __init__(self, probe_s: float = PROBE_S, connect_s: float = CONNECT_S, raylets: Raylets = ray_raylets,
                 clock: Callable[[], float] = time.monotonic, answers: Optional[Answers] = None) -> None:
        """``answers``: how the calls are awaited (None: Ray's)."""
        self.probe_s = probe_s
        self.connect_s = connect_s
        self.raylets = raylets
        self.clock = clock
        self.answers: Answers = answers if answers is not None else RayAnswers()
        self._raylets: dict[str, tuple[str, int]] = {}
        self.reset()

    def reset(self) -> None:
        """The group changed its actors: forget every probe and answer; no probes until armed again."""
        self._armed = False
        self._pending: dict[Hashable, tuple[ProbeUnit, Any]] = {}
        """unit key (a rank, or a node) -> the unit and its call not answered yet."""
        self._since: dict[int, float] = {}
        """rank -> since when it has not answered (the oldest probe it left unanswered)."""
        self._waiting: dict[int, bool] = {}
        """rank -> its last answer."""
        self._lost: set[int] = set()
        """Ranks known lost: an answer still pending for their unit says nothing of them."""

    @property
    def armed(self) -> bool:
        """Whether a survivor has said it waits: probes go out from then on."""
        return self._armed

    def forget(self, rank: int) -> None:
        """``rank`` is known lost: no more probes or checks of it."""
        self._lost.add(rank)
        self._since.pop(rank, None)
        self._waiting.pop(rank, None)
        self._pending = {key: sent for key, sent in self._pending.items() if not set(sent[0].ranks) <= self._lost}

    def arm(self, waiting: Collection[int]) -> None:
        """Ranks of ``waiting`` said, when drained, that they wait in their warm link: probe from now on."""
        if waiting:
            self._armed = True

    def send(self, units: Mapping[Hashable, ProbeUnit]) -> None:
        """Once armed, a probe to every unit of ``units`` (by key: a rank, or a node) that has none
        pending: one call for all the unit's ranks."""
        if not self._armed:
            return
        now = self.clock()
        for key, unit in units.items():
            if key not in self._pending:
                self._pending[key] = (unit, unit.ask())
                for rank in unit.ranks:
                    self._since.setdefault(rank, now)

    def check(self, workers: Sequence[WorkerInfo]) -> ProbeResult:
        """Collect the answers; while a rank waits in its warm link, give the others up to
        ``probe_s`` to answer and check the nodes of those still silent (each node once)."""
        self._collect(self.clock())
        waiting = tuple(sorted(rank for rank, answer in self._waiting.items() if answer))
        if not waiting:
            return ProbeResult()
        since = [self._since[rank] for rank in self._since if rank not in waiting]
        if since:
            self._collect(max(since) + self.probe_s)
        silent = silent_ranks(waiting, self._unanswered_s(waiting), self.probe_s)
        refusals: dict[str, Optional[str]] = {}
        unreachable = {}
        for rank in silent:
            node_id = workers[rank].node_id
            if node_id not in refusals:  # a node's silent ranks share its raylet: one connection each
                refusals[node_id] = self._node_refusal(node_id)
            if refusals[node_id] is not None:
                unreachable[rank] = self._lost_text(workers[rank], waiting, refusals[node_id])
                self.forget(rank)
        return ProbeResult(waiting, tuple(silent), unreachable)

    def _unanswered_s(self, waiting: Collection[int]) -> dict[int, float]:
        now = self.clock()
        return {rank: now - since for rank, since in self._since.items() if rank not in waiting}

    def _collect(self, until: float) -> None:
        """Take the answers back until ``until`` (on :attr:`clock`; in the past: those already back)."""
        while self._pending:
            calls = {call: key for key, (_, call) in self._pending.items()}
            for call in self.answers.ready(list(calls), max(0.0, until - self.clock())):
                self._answer(calls[call])
            if self.clock() >= until:
                return

    def _answer(self, key: Hashable) -> None:
        unit, call = self._pending.pop(key)
        ranks = [rank for rank in unit.ranks if rank not in self._lost]
        try:
            waiting = unit.waiting(self.answers.value(call))
        except ActorUnavailableError:
            return  # no answer: its ranks stay silent since their first unanswered probe
        except RayActorError:  # Ray knows it died (a dead actor on a live node): its run says so
            waiting = None
        for rank in ranks:
            if waiting is None:
                self._waiting.pop(rank, None)
            else:
                self._waiting[rank] = rank in waiting
            self._since.pop(rank, None)

    def _node_refusal(self, node_id: str) -> Optional[str]:
        """Why ``node_id``'s raylet takes no connection (None: it takes one)."""
        if node_id not in self._raylets:
            self._raylets = dict(self.raylets())
        if node_id not in self._raylets:
            return None  # nothing to ask: left to Ray
        host, port = self._raylets[node_id]
        refusal = raylet_refusal(host, port, self.connect_s)
        return f"its raylet {host}:{port} took no connection ({refusal})" if refusal is not None else None

    def _lost_text(self, worker: WorkerInfo, waiting: tuple[int, ...], refusal: str) -> str:
        return (f"rank {worker.rank}'s node {node_name(worker.node_id)} {NODE_UNREACHABLE} within "
                f"{self.probe_s:g} s and {refusal}, while rank(s) {', '.join(map(str, waiting))} wait for a lost "
                f"peer (pid {worker.pid}; found by the driver's probe before Ray declared the node dead)")
