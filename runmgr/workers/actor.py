"""One rank of the run: a Ray actor that runs ``trainer.train`` in its own
process and buffers the trainer's reports until the driver drains them.

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
from typing import TYPE_CHECKING, Callable, Optional

import ray

from runmgr.controller.group import WorkerInfo
from runmgr.ports import rendezvous_port
from runmgr.workers.lease import DriverIdentity, DriverLease, SelfStop, ray_job_alive
from trainer.config import TrainerConfig
from trainer.plan import ResumePlan
from trainer.report import CheckpointReport, Heartbeat, LocalNormsReport, Reporter, StartReport, StepReport

if TYPE_CHECKING:
    from trainer.warm import Rejoin

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


class ActorWarmLink:
    """The warm link of a rank in an actor (trainer/warm.py): the training thread blocks in
    :meth:`rejoin` or :meth:`join` until the driver answers through :meth:`answer`, called on
    the actor's other thread."""

    def __init__(self) -> None:
        self._answered = threading.Event()
        self._answer: Optional["Rejoin"] = None
        self.waiting_since: Optional[float] = None
        self.buddy_offset = 1
        """Where this rank's buddy sits, ranks on (the group sets it from where the ranks run)."""

    def rejoin(self, error: BaseException, newest_snapshot: Optional[int]) -> Optional["Rejoin"]:
        return self._wait()

    def join(self) -> "Rejoin":
        answer = self._wait()
        if answer is None:
            raise SpareReleased("the driver released this spare")
        return answer

    def answer(self, rejoin: Optional["Rejoin"]) -> None:
        """Where the group re-forms (None: restart cold, the training thread raises)."""
        self._answer = rejoin
        self._answered.set()

    def _wait(self) -> Optional["Rejoin"]:
        self.waiting_since = time.time()
        self._answered.wait()
        answer, self._answer = self._answer, None
        self._answered.clear()
        self.waiting_since = None
        return answer


class SpareReleased(Exception):
    """A spare the driver let go without a rank to replace."""


class TrainerWorker:
    """A rank. Created by :class:`RayWorkerGroup` inside a placement group."""

    def __init__(self, rank: int, world_size: int, lease_s: float, driver: Optional[DriverIdentity] = None) -> None:
        """``driver``: who drives this worker (None: unknown, the lease alone decides)."""
        self.rank = rank
        self.world_size = world_size
        self.lease = DriverLease(lease_s, driver, job_alive=ray_job_alive)
        self.self_stop = SelfStop(self.lease, rank)
        self.reporter = BufferingReporter(gate=self.self_stop.gate)
        self.warm_link = ActorWarmLink()
        threading.Thread(target=self.self_stop.watch, name="driver-lease", daemon=True).start()

    def describe(self) -> WorkerInfo:
        context = ray.get_runtime_context()
        return WorkerInfo(self.rank, os.getpid(), context.get_node_id(), ray.util.get_node_ip_address())

    def reserve_port(self) -> int:
        """A free TCP port on this node for the process group's rendezvous."""
        return rendezvous_port()

    def run(self, config: TrainerConfig, plan: ResumePlan, master_addr: str, master_port: int,
            wrap_reporter: Optional[WrapReporter] = None, warm: bool = False, buddy_offset: int = 1) -> dict:
        """Train as this rank; ``warm``: survive a peer's death through the warm link, with the
        snapshot's buddy ``buddy_offset`` ranks on."""
        # Imported here so that the driver never pays for the trainer's imports.
        import trainer
        from trainer.loop import DistEnv

        env = DistEnv(rank=self.rank, world_size=self.world_size, local_rank=0,
                      master_addr=master_addr, master_port=master_port)
        started = time.time()
        reporter = wrap_reporter(self.reporter, plan) if wrap_reporter is not None else self.reporter
        self.self_stop.idle.clear()
        self.warm_link.buddy_offset = buddy_offset
        try:
            result = trainer.train(config, plan, reporter, env, self.warm_link if warm else None)
        finally:
            self.self_stop.idle.set()
        return {"rank": self.rank, "seconds": time.time() - started, "result": repr(result)}

    def run_spare(self, config: TrainerConfig, plan: ResumePlan,
                  wrap_reporter: Optional[WrapReporter] = None, buddy_offset: int = 1) -> dict:
        """A ready spare: build the model now, wait for a rank to replace, then train as it."""
        from trainer.loop import train_spare

        started = time.time()
        self.warm_link.buddy_offset = buddy_offset
        reporter = wrap_reporter(self.reporter, plan) if wrap_reporter is not None else self.reporter
        self.self_stop.idle.clear()  # it trains once named: a lost driver stops it at a beat, as a rank
        try:
            result = train_spare(config, reporter, self.warm_link)
        except SpareReleased:
            return {"rank": None, "seconds": time.time() - started, "result": "released"}
        finally:
            self.self_stop.idle.set()
        return {"rank": self.rank, "seconds": time.time() - started, "result": repr(result)}

    def answer(self, rejoin: Optional["Rejoin"]) -> None:
        """The driver's answer to a rank waiting in the warm link (a spare takes the rank named)."""
        if rejoin is not None:
            self.rank = rejoin.dist_env.rank
        self.warm_link.answer(rejoin)

    def waiting(self) -> bool:
        """Whether this rank waits in its warm link for the group to re-form."""
        return self.warm_link.waiting_since is not None

    def drain(self) -> list[tuple[str, object]]:
        """What the rank reported since the last drain, and whether it waits in its warm link
        now (the driver learns it with no call of its own: no probe while all goes well)."""
        self.lease.renew()
        items = self.reporter.take()
        if self.waiting():
            items.append(("waiting", self.rank))
        return items


RemoteTrainerWorker = ray.remote(max_concurrency=2, max_restarts=0)(TrainerWorker)
