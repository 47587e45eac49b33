"""The mid-run device poll: one small Ray actor per node reads health and ECC
counters every ``interval_s`` and pushes what it read to one collector actor
beside the driver; ``drain`` takes them from there for the watcher's device
detector.

A node that a run's node actor holds has no poller: the built-in trainer's node agent
(runmgr/workers/node_agent.py) and a Megatron job's node actor (runmgr/workers/megatron_node.py)
each run the same :class:`NodeDevicePoll` in a thread of their own (:class:`HeldNodePoll`) and
hand the readings to the driver with what it drains from them anyway (the agent's NodeReport,
the Megatron node's drain). The admitted nodes no node actor holds (kept in reserve, freed by an
exclusion or a resize, joined as a replacement) get a poller each: :meth:`DevicePollGroup.cover`
follows each sub-run's placement.

Push, not pull: a reading reaches the collector as soon as it is taken, and
the driver's loop asks one actor, however many nodes there are. The pollers
need no CPU reservation (they sleep between short tool calls) and import no
torch, so they fit beside the workers of a full node.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import AbstractSet, Callable, Iterable, Optional, Sequence

from health.probes.bounded import CommandResult, run_tool
from runmgr.nodes import node_name
from runmgr.watch.device_readings import Runner, read_devices
from runmgr.watch.observations import DeviceObservation

START_TIMEOUT_S = 60.0
MAX_READINGS = 100_000
"""The collector keeps at most this many undrained readings (the oldest go first)."""


def tool_runner(timeout_s: float, path: Optional[str] = None) -> Runner:
    """Runs a vendor tool on this node, bounded by ``timeout_s`` (a hung driver
    answers "timeout"); ``path`` replaces $PATH when set (scripted tools)."""
    def run(name: str, args: Sequence[str]) -> CommandResult:
        return run_tool(name, args, timeout_s, path=path)
    return run


@dataclass(frozen=True)
class DevicePollSettings:
    """How a node's devices are read mid-run (by a :class:`DevicePoller`, or by the actor that holds the node)."""

    interval_s: float
    """Between the starts of two readings (``health.poll_interval_s``)."""
    path: Optional[str] = None
    """Replaces $PATH for the tools when set (chaos's scripted tools)."""
    tool_timeout_s: float = 10.0
    """A tool's bound: a hung driver answers "timeout"."""
    read_kernel_log: bool = True
    """Whether the kernel log's device lines are read too."""


class NodeDevicePoll:
    """Reads one node's devices every interval in a thread of the calling process (on that
    node) and hands each non-empty reading to ``sink``."""

    def __init__(self, node: str, settings: DevicePollSettings,
                 sink: Callable[[list[DeviceObservation]], object]) -> None:
        if settings.interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {settings.interval_s}")
        self.node = node
        self.settings = settings
        self.sink = sink
        self.run = tool_runner(settings.tool_timeout_s, settings.path)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="device-poll", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            readings = read_devices(self.node, self.run, time.time(), self.settings.read_kernel_log)
            if readings:
                self.sink(readings)
            self._stop.wait(max(0.0, self.settings.interval_s - (time.monotonic() - started)))

    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        """No reading after the one under way (a process that outlives its poll: a test's)."""
        self._stop.set()


class HeldNodePoll:
    """The device poll of the node a node actor holds (a built-in trainer's node agent, a
    Megatron job's node actor), run in that actor's process: the readings wait there until the
    actor hands them to the driver with its next report or drain. Kept between sub-runs (the
    actor is), so a reading taken while no sub-run runs comes with the next one's first."""

    def __init__(self, node: str, settings: DevicePollSettings) -> None:
        self._readings: deque[DeviceObservation] = deque(maxlen=MAX_READINGS)
        self.poll = NodeDevicePoll(node, settings, sink=self._readings.extend)

    def take(self) -> tuple[DeviceObservation, ...]:
        """The readings since the last take, oldest first (the poll's thread appends; a deque's
        popleft and append are safe between threads)."""
        taken = []
        while self._readings:
            taken.append(self._readings.popleft())
        return tuple(taken)

    def stop(self) -> None:
        self.poll.stop()


class ReadingCollector:
    """Readings of every poller until the driver takes them (a Ray actor)."""

    def __init__(self) -> None:
        self._readings: deque[DeviceObservation] = deque(maxlen=MAX_READINGS)

    def add(self, readings: list[DeviceObservation]) -> None:
        self._readings.extend(readings)

    def take(self) -> list[DeviceObservation]:
        readings = list(self._readings)
        self._readings.clear()
        return readings


class DevicePoller:
    """The poll on one node (a Ray actor pinned there)."""

    def __init__(self, node: str, interval_s: float, path: Optional[str], tool_timeout_s: float,
                 read_kernel_log: bool, collector) -> None:
        self.collector = collector
        self.poll = NodeDevicePoll(node, DevicePollSettings(interval_s, path, tool_timeout_s, read_kernel_log),
                                   sink=lambda readings: self.collector.add.remote(readings))

    def ready(self) -> bool:
        return self.poll.alive()


def poller_changes(admitted: Sequence[str], held: AbstractSet[str],
                   polled: Iterable[str]) -> tuple[list[str], list[str]]:
    """(the nodes to start a poller on, the nodes whose poller ends), so that exactly the
    ``admitted`` nodes not in ``held`` (those a node actor reads) are polled; in ``admitted``'s
    order, then ``polled``'s."""
    wanted = [node for node in admitted if node not in held]
    polled = list(polled)
    return [node for node in wanted if node not in polled], [node for node in polled if node not in wanted]


class DevicePollGroup:
    """A :class:`DevicePoller` on each node of ``node_ids`` (the admitted nodes) that no node
    actor reads, and their collector (started with the first poller).

    The node actors of a run (the built-in trainer's node agents, a Megatron job's node actors)
    read their own nodes: :meth:`cover` is told which nodes a sub-run's node actors hold, and the
    pollers follow, so a node is read by its node actor or by a poller, not by both (but for a
    moment at a handover, which the watcher's device detector tells apart:
    runmgr/watch/devices.py). :meth:`start` polls every node (no node actor reads any).

    Readings name the node by the start of its Ray id, as incidents do.
    """

    def __init__(self, node_ids: Sequence[str], interval_s: float, path: Optional[str] = None,
                 tool_timeout_s: float = 10.0, read_kernel_log: bool = True) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.node_ids = list(node_ids)
        self.interval_s = interval_s
        self.path = path
        self.tool_timeout_s = tool_timeout_s
        self.read_kernel_log = read_kernel_log
        self._collector = None
        self._pollers: dict[str, object] = {}
        """Node id -> its poller actor."""
        self._held: Optional[frozenset[str]] = None
        """The nodes their node actors read (None: nothing is polled yet)."""
        self._pending = None
        """The collector's answer not yet back (taken by a later drain)."""

    @property
    def polled(self) -> list[str]:
        """The node ids that have a poller now."""
        return list(self._pollers)

    def start(self) -> None:
        """Poll every node (no node actor reads any): once each poller runs."""
        started = self._follow(frozenset())
        self._wait_ready(started)

    def cover(self, held: AbstractSet[str]) -> None:
        """Poll the nodes no node actor reads: ``held`` are the Ray ids of the nodes a sub-run's node actors
        hold. Pollers on those nodes end, and each admitted node outside them gets one; a new
        poller's readings come once it runs (the sub-run's start does not wait for it)."""
        self._follow(frozenset(held))

    def add_node(self, node_id: str) -> None:
        """Take in a node that joined the run after the start (KubeRay's replacement of an
        excluded node's pod), once; polled at once when no node actor reads it."""
        if node_id in self.node_ids:
            return
        self.node_ids.append(node_id)
        if self._held is not None:
            self._wait_ready(self._follow(self._held))

    def _follow(self, held: frozenset[str]) -> list:
        """Pollers on exactly the admitted nodes outside ``held``; the pollers started."""
        self._held = held
        start, stop = poller_changes(self.node_ids, held, self._pollers)
        for node_id in stop:
            self._end(self._pollers.pop(node_id))
        started = [self._poller_on(node_id) for node_id in start]
        self._pollers.update(zip(start, started))
        return started

    def _wait_ready(self, pollers: list) -> None:
        import ray

        if pollers:
            ray.get([p.ready.remote() for p in pollers], timeout=START_TIMEOUT_S)

    def _poller_on(self, node_id: str):
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if self._collector is None:
            here = ray.get_runtime_context().get_node_id()
            self._collector = ray.remote(num_cpus=0, max_restarts=0)(ReadingCollector).options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=True)).remote()
        poller = ray.remote(num_cpus=0, max_restarts=0)(DevicePoller)
        return (poller.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False))
                .remote(node_name(node_id), self.interval_s, self.path, self.tool_timeout_s,
                        self.read_kernel_log, self._collector))

    def _end(self, poller) -> None:
        """A poller ends (its node's node actor reads it now); what it sent stays in the collector."""
        import ray

        ray.kill(poller, no_restart=True)

    def drain(self, wait_s: float = 0.05) -> list[DeviceObservation]:
        """The readings that arrived since the last drain, oldest first; an
        answer not back within ``wait_s`` is picked up by a later drain, so the
        caller's loop is never held up. A poller whose node died sends nothing:
        the worker group reports the loss."""
        import ray

        if self._collector is None:
            return []
        if self._pending is None:
            self._pending = self._collector.take.remote()
        ready, _ = ray.wait([self._pending], timeout=wait_s)
        if not ready:
            return []
        readings = ray.get(self._pending)
        self._pending = None
        return sorted(readings, key=lambda r: r.time)

    def stop(self) -> None:
        """End every poller and the collector (the lineage ends)."""
        import ray

        for actor in [*self._pollers.values(), *([self._collector] if self._collector else [])]:
            ray.kill(actor, no_restart=True)
        self._pollers, self._collector, self._pending, self._held = {}, None, None, None
