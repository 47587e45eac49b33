"""One rank of the run: a Ray actor that runs ``trainer.train`` in its own
process and buffers the trainer's reports until the driver drains them.

The actor is threaded (``max_concurrency=2``): one thread trains, the other
answers ``drain`` so reports stream while a step runs.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections import deque
from typing import Callable, Optional

import ray

from runmgr.controller.group import WorkerInfo
from trainer.config import TrainerConfig
from trainer.plan import ResumePlan
from trainer.report import CheckpointReport, Heartbeat, Reporter, StartReport, StepReport

WrapReporter = Callable[[Reporter, ResumePlan], Reporter]
"""What a rank's reports pass through on their way to the driver (chaos's pause at a step)."""


class BufferingReporter:
    """Collects reports thread-safely; the driver takes them with ``take``."""

    def __init__(self, max_items: int = 100_000) -> None:
        self._items: deque[tuple[str, object]] = deque(maxlen=max_items)
        self._lock = threading.Lock()

    def started(self, report: StartReport) -> None:
        self._push("started", report)

    def step(self, report: StepReport) -> None:
        self._push("step", report)

    def checkpoint(self, report: CheckpointReport) -> None:
        self._push("checkpoint", report)

    def heartbeat(self, beat: Heartbeat) -> None:
        self._push("heartbeat", beat)

    def _push(self, kind: str, item: object) -> None:
        with self._lock:
            self._items.append((kind, item))

    def take(self) -> list[tuple[str, object]]:
        with self._lock:
            items = list(self._items)
            self._items.clear()
        return items


# Exit code of a worker that stopped itself because its driver went silent.
EXIT_DRIVER_LOST = 75


class DriverLease:
    """The driver renews the lease with every drain; a worker whose driver has
    been silent for ``lease_s`` ends its own process, so a driver killed with
    kill -9 leaves no orphan training (and writing checkpoints) on its own."""

    def __init__(self, lease_s: float, clock=time.monotonic) -> None:
        self.lease_s = lease_s
        self.clock = clock
        self._renewed = clock()

    def renew(self) -> None:
        self._renewed = self.clock()

    def expired(self) -> bool:
        return self.clock() - self._renewed > self.lease_s

    def watch(self, check_every_s: float = 0.5) -> None:
        """Run in a daemon thread: exit the process once the lease expires."""
        while not self.expired():
            time.sleep(check_every_s)
        print(f"runmgr worker {os.getpid()}: no word from the driver for {self.lease_s:.0f} s; stopping", flush=True)
        os._exit(EXIT_DRIVER_LOST)


class TrainerWorker:
    """A rank. Created by :class:`RayWorkerGroup` inside a placement group."""

    def __init__(self, rank: int, world_size: int, lease_s: float) -> None:
        self.rank = rank
        self.world_size = world_size
        self.reporter = BufferingReporter()
        self.lease = DriverLease(lease_s)
        threading.Thread(target=self.lease.watch, name="driver-lease", daemon=True).start()

    def describe(self) -> WorkerInfo:
        context = ray.get_runtime_context()
        return WorkerInfo(self.rank, os.getpid(), context.get_node_id(), ray.util.get_node_ip_address())

    def reserve_port(self) -> int:
        """A free TCP port on this node for the process group's rendezvous."""
        with socket.socket() as sock:
            sock.bind(("", 0))
            return sock.getsockname()[1]

    def run(self, config: TrainerConfig, plan: ResumePlan, master_addr: str, master_port: int,
            wrap_reporter: Optional[WrapReporter] = None) -> dict:
        # Imported here so that the driver never pays for the trainer's imports.
        import trainer
        from trainer.loop import DistEnv

        env = DistEnv(rank=self.rank, world_size=self.world_size, local_rank=0,
                      master_addr=master_addr, master_port=master_port)
        started = time.time()
        reporter = wrap_reporter(self.reporter, plan) if wrap_reporter is not None else self.reporter
        result = trainer.train(config, plan, reporter, env)
        return {"rank": self.rank, "seconds": time.time() - started, "result": repr(result)}

    def drain(self) -> list[tuple[str, object]]:
        self.lease.renew()
        return self.reporter.take()


RemoteTrainerWorker = ray.remote(max_concurrency=2, max_restarts=0)(TrainerWorker)
