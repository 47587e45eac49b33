"""The mid-run device poll: one small Ray actor per node reads health and ECC
counters every ``interval_s`` and keeps the readings until the driver drains
them; the watcher's device detector turns them into incidents.

The actor needs no CPU reservation (it sleeps between short tool calls) and
imports no torch, so it fits beside the workers of a full node.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Optional, Sequence

from runmgr.healthcheck.device_readings import read_devices, tool_runner
from runmgr.healthcheck.nodes import SHORT_ID_CHARS
from runmgr.watch.observations import DeviceObservation

START_TIMEOUT_S = 60.0
DRAIN_TIMEOUT_S = 5.0


class DevicePoller:
    """The poll on one node (run as a Ray actor pinned there)."""

    def __init__(self, node: str, interval_s: float, path: Optional[str], tool_timeout_s: float,
                 read_kernel_log: bool, max_readings: int = 10_000) -> None:
        self.node = node
        self.interval_s = interval_s
        self.run = tool_runner(tool_timeout_s, path)
        self.read_kernel_log = read_kernel_log
        self._readings: deque[DeviceObservation] = deque(maxlen=max_readings)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="device-poll", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            readings = read_devices(self.node, self.run, time.time(), self.read_kernel_log)
            with self._lock:
                self._readings.extend(readings)
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    def ready(self) -> bool:
        return self._thread.is_alive()

    def drain(self) -> list[DeviceObservation]:
        with self._lock:
            readings = list(self._readings)
            self._readings.clear()
        return readings

    def stop(self) -> None:
        self._stop.set()


class DevicePollGroup:
    """One :class:`DevicePoller` per node; ``drain`` gathers what they saw.

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
        self._actors: dict[str, object] = {}

    def start(self) -> None:
        """Start a poller on every node and wait until each runs."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        remote = ray.remote(num_cpus=0, max_restarts=0, max_concurrency=2)(DevicePoller)
        self._actors = {
            node_id: remote.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False))
            .remote(node_id[:SHORT_ID_CHARS], self.interval_s, self.path, self.tool_timeout_s,
                    self.read_kernel_log)
            for node_id in self.node_ids}
        ray.get([a.ready.remote() for a in self._actors.values()], timeout=START_TIMEOUT_S)

    def drain(self) -> list[DeviceObservation]:
        """Every reading since the last drain, oldest first. A poller that is
        gone (its node died) has nothing to say: the worker group reports the loss."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        readings: list[DeviceObservation] = []
        refs = [a.drain.remote() for a in self._actors.values()]
        for ref in refs:
            try:
                readings += ray.get(ref, timeout=DRAIN_TIMEOUT_S)
            except (RayActorError, GetTimeoutError):
                continue
        return sorted(readings, key=lambda r: r.time)

    def stop(self) -> None:
        import ray

        for actor in self._actors.values():
            ray.kill(actor, no_restart=True)
        self._actors = {}
