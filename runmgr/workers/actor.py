"""One rank of the run: a Ray actor that runs ``trainer.train`` in its own
process and buffers the trainer's reports until the driver drains them.

This is the per-rank design, cold restarts only: a launch runs its ranks under node agents
(runmgr/workers/node_agent.py, warm spares included); the benches run this beside them to
compare the two designs (bench/launch_cpu.py, bench/scale.py).

The actor is threaded (``max_concurrency=2``): one thread trains, the other
answers ``drain`` so reports stream while a step runs. A daemon thread of its
own watches the driver (runmgr/workers/lease.py): the worker trains only
while its driver lives.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from typing import Callable, Optional

import ray

from runmgr.controller.group import WorkerInfo
from runmgr.ports import rendezvous_port
from runmgr.workers.lease import DriverIdentity, DriverLease, SelfStop, ray_job_alive
from trainer.config import TrainerConfig
from trainer.plan import ResumePlan
from trainer.report import CheckpointReport, Heartbeat, LocalNormsReport, Reporter, StartReport, StepReport

WrapReporter = Callable[[Reporter, ResumePlan], Reporter]
"""What a rank's reports pass through on their way to the driver (chaos's pause at a step)."""


class BufferingReporter:
    """Collects reports thread-safely; the driver takes them with ``take``.
    Every heartbeat first passes ``gate``, which may stop the training there
    (:meth:`runmgr.workers.lease.SelfStop.gate`)."""

    def __init__(self, max_items: int = 100_000, gate: Callable[[Heartbeat], None] = lambda beat: None) -> None:
        self._items: deque[tuple[str, object]] = deque(maxlen=max_items)
        self._lock = threading.Lock()
        self.gate = gate

    def started(self, report: StartReport) -> None:
        self._push("started", report)

    def step(self, report: StepReport) -> None:
        self._push("step", report)

    def checkpoint(self, report: CheckpointReport) -> None:
        self._push("checkpoint", report)

    def local_norms(self, report: LocalNormsReport) -> None:
        self._push("local_norms", report)

    def heartbeat(self, beat: Heartbeat) -> None:
        self.gate(beat)
        self._push("heartbeat", beat)

    def _push(self, kind: str, item: object) -> None:
        with self._lock:
            self._items.append((kind, item))

    def take(self) -> list[tuple[str, object]]:
        with self._lock:
            items = list(self._items)
            self._items.clear()
        return items


class TrainerWorker:
    """A rank. Created by :class:`RayWorkerGroup` inside a placement group."""

    def __init__(self, rank: int, world_size: int, lease_s: float, driver: Optional[DriverIdentity] = None) -> None:
        """``driver``: who drives this worker (None: unknown, the lease alone decides)."""
        self.rank = rank
        self.world_size = world_size
        self.lease = DriverLease(lease_s, driver, job_alive=ray_job_alive)
        self.self_stop = SelfStop(self.lease, rank)
        self.reporter = BufferingReporter(gate=self.self_stop.gate)
        threading.Thread(target=self.self_stop.watch, name="driver-lease", daemon=True).start()

    def describe(self) -> WorkerInfo:
        context = ray.get_runtime_context()
        return WorkerInfo(self.rank, os.getpid(), context.get_node_id(), ray.util.get_node_ip_address())

    def reserve_port(self) -> int:
        """A free TCP port on this node for the process group's rendezvous."""
        return rendezvous_port()

    def run(self, config: TrainerConfig, plan: ResumePlan, master_addr: str, master_port: int,
            wrap_reporter: Optional[WrapReporter] = None) -> dict:
        """Train as this rank (a peer's death ends the sub-run: the restart is cold)."""
        # Imported here so that the driver never pays for the trainer's imports.
        import trainer
        from trainer.loop import DistEnv

        env = DistEnv(rank=self.rank, world_size=self.world_size, local_rank=0,
                      master_addr=master_addr, master_port=master_port)
        started = time.time()
        reporter = wrap_reporter(self.reporter, plan) if wrap_reporter is not None else self.reporter
        self.self_stop.idle.clear()
        try:
            result = trainer.train(config, plan, reporter, env)
        finally:
            self.self_stop.idle.set()
        return {"rank": self.rank, "seconds": time.time() - started, "result": repr(result)}

    def drain(self) -> list[tuple[str, object]]:
        """What the rank reported since the last drain."""
        self.lease.renew()
        return self.reporter.take()


RemoteTrainerWorker = ray.remote(max_concurrency=2, max_restarts=0)(TrainerWorker)
