"""The driver lease: a worker trains only while its driver lives.

The driver renews the lease whenever it drains the worker. A worker stops
itself (ends its process) when its driver is gone:

- at once, when the driver runs on this machine (the same kernel and pid
  namespace) and its process has ended: its pid is gone, a zombie, or
  another process's (another start time);
- after ``lease_s`` without a drain, when the driver runs elsewhere and Ray
  no longer counts its job alive, or nothing can tell.

A driver that is alive but silent (starved of CPU, blocked on its disk) is
not a dead one: its process is seen alive here, or Ray counts its job alive,
and its workers go on, saying once that they wait for it.

The trainer beats ``checkpoint`` before it starts a checkpoint and before it
commits one (trainer/loop.py); the worker checks its driver there and then,
not at the next tick of its watch, so a rank whose driver is gone writes and
commits nothing more: the run's durable state never advances without a
driver. A rank that stops while its driver may still be there ends its
training with :class:`DriverLostError`, whose text the driver reads as a
death of its own kind (``driver_lost``, runmgr/watch/deaths.py), not a kill.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from trainer.report import Heartbeat, Reporter

EXIT_DRIVER_LOST = 75
"""Exit code of a worker that stopped itself because its driver was gone."""
CHECKPOINT_PHASE = "checkpoint"
JOB_QUERY_TIMEOUT_S = 2.0
"""How long a worker waits for Ray's view of its driver's job."""
REPLY_GRACE_S = 1.0
"""After the training thread ended with DriverLostError: time for Ray to hand the
error to the driver, if it is still there, before the process ends."""
_PROC = Path("/proc")


def say_in_worker_log(text: str) -> None:
    print(text, flush=True)  # a Ray worker's stdout is its log file


class DriverLostError(RuntimeError):
    """Ends the training of a worker that stopped itself; its text is what a
    live driver reads (``driver_lost`` in runmgr/watch/deaths.py)."""


def process_start_ticks(pid: int) -> Optional[int]:
    """When process ``pid`` started (clock ticks since boot, /proc/<pid>/stat),
    or None when there is no such live process (gone, or a zombie)."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses
    state, start_ticks = fields[0], fields[19]  # stat(5): fields 3 and 22
    return None if state in ("Z", "X") else int(start_ticks)


def kernel_identity() -> Optional[str]:
    """This kernel's boot id and this process's pid namespace: a pid names the
    same process only between processes that share both. None without /proc."""
    try:
        boot_id = (_PROC / "sys/kernel/random/boot_id").read_text().strip()
        namespace = os.stat(_PROC / "self/ns/pid").st_ino
    except OSError:
        return None
    return f"{boot_id}/{namespace}"


@dataclass(frozen=True)
class DriverIdentity:
    """Who the driver is, so that a worker can tell whether it still lives."""

    pid: int
    start_ticks: Optional[int]
    """When the driver's process started: tells it from a later process given the same pid."""
    kernel: Optional[str]
    """:func:`kernel_identity` of the driver; its pid means something only where it is the same."""

    @classmethod
    def of_this_process(cls) -> "DriverIdentity":
        pid = os.getpid()
        return cls(pid, process_start_ticks(pid), kernel_identity())

    def alive_here(self) -> Optional[bool]:
        """Whether the driver's process lives, when it runs in this kernel and pid
        namespace; None when it runs elsewhere (its pid means nothing here)."""
        if self.kernel is None or self.kernel != kernel_identity():
            return None
        started = process_start_ticks(self.pid)
        return started is not None and started == self.start_ticks


def ray_job_alive() -> Optional[bool]:
    """Whether Ray counts this worker's job, i.e. its driver, alive; None when
    it cannot tell (Ray's head unreachable, or a Ray without this view)."""
    from ray._private import worker as ray_worker
    from ray.exceptions import RpcError

    gcs = getattr(ray_worker.global_worker, "gcs_client", None)
    job_id = getattr(ray_worker.global_worker, "current_job_id", None)
    if gcs is None or job_id is None or not hasattr(gcs, "get_all_job_info"):
        return None
    try:
        jobs = gcs.get_all_job_info(job_or_submission_id=job_id.hex(), skip_submission_job_info_field=True,
                                    skip_is_running_tasks_field=True, timeout=JOB_QUERY_TIMEOUT_S)
    except RpcError:
        return None
    job = jobs.get(job_id)
    return None if job is None else not job.is_dead


@dataclass(frozen=True)
class LostDriver:
    """Why a worker stops."""

    reason: str
    confirmed: bool
    """True when the driver is known to be gone (nobody is left to tell); False when
    only its silence is known (it may yet read why its worker stopped)."""


class DriverLease:
    """Renewed by every drain; tells a dead driver from a silent one."""

    def __init__(self, lease_s: float, driver: Optional[DriverIdentity] = None,
                 job_alive: Callable[[], Optional[bool]] = lambda: None,
                 clock: Callable[[], float] = time.monotonic,
                 say: Callable[[str], None] = say_in_worker_log) -> None:
        """``driver``: None when unknown (the lease alone decides); ``job_alive``: Ray's
        view of the driver (:func:`ray_job_alive`); ``say``: the worker's log."""
        self.lease_s = lease_s
        self.driver = driver
        self.job_alive = job_alive
        self.clock = clock
        self.say = say
        self._renewed = clock()
        self._said_waiting = False

    def renew(self, silent_s: float = 0.0) -> None:
        """The driver was last heard ``silent_s`` ago (a node agent learns it from its push's
        answer: how long the driver has not drained its inbox)."""
        self._renewed = max(self._renewed, self.clock() - silent_s)
        self._said_waiting = False

    def silent_s(self) -> float:
        return self.clock() - self._renewed

    def expired(self) -> bool:
        return self.silent_s() > self.lease_s

    def lost(self, before_write: bool = False) -> Optional[LostDriver]:
        """Why the driver counts as gone, or None while it is (or may be) alive.
        ``before_write``: about to write or commit a checkpoint, so Ray is asked
        about a driver elsewhere even within the lease."""
        here = self.driver.alive_here() if self.driver is not None else None
        if here is False:
            return LostDriver(f"its driver (pid {self.driver.pid}, on this machine) is gone", confirmed=True)
        if here is True:
            self._note_alive(f"its process (pid {self.driver.pid}) is alive")
            return None
        if not (self.expired() or before_write):
            return None
        ray_view = self.job_alive()
        if ray_view is True:
            self._note_alive("Ray counts its job alive")
            return None
        if ray_view is False:
            return LostDriver("Ray reports its driver's job ended", confirmed=True)
        if not self.expired():
            return None
        return LostDriver(f"no word from the driver for {self.silent_s():.0f} s (lease {self.lease_s:g} s) "
                          f"and nothing shows it alive", confirmed=False)

    def _note_alive(self, how: str) -> None:
        """Say once per silence that a silent driver is waited for, not abandoned."""
        if self.expired() and not self._said_waiting:
            self._said_waiting = True
            self.say(f"runmgr worker {os.getpid()}: no word from the driver for {self.silent_s():.0f} s "
                     f"(lease {self.lease_s:g} s), but {how}: busy or starved, not dead; training on")


def stopped_itself(pid: int, rank: int, why: str) -> str:
    """How a worker words its stop (``driver_lost`` in runmgr/watch/deaths.py reads it)."""
    return f"runmgr worker {pid} (rank {rank}) stopped itself: {why}"


class SelfStop:
    """Carries a lost lease out: the training thread stops at its next beat (before
    any further checkpoint write or commit), then the process ends."""

    def __init__(self, lease: DriverLease, rank: int, exit: Callable[[int], None] = os._exit,
                 sleep: Callable[[float], None] = time.sleep, check_every_s: float = 0.5) -> None:
        self.lease = lease
        self.rank = rank
        self.exit = exit
        self.sleep = sleep
        self.check_every_s = check_every_s
        self.idle = threading.Event()
        """Set while no training runs in this worker (the actor's ``run`` clears it)."""
        self.idle.set()
        self._lost: Optional[LostDriver] = None

    @property
    def reason(self) -> Optional[str]:
        if self._lost is None:
            return None
        return stopped_itself(os.getpid(), self.rank, self._lost.reason)

    @property
    def lost(self) -> Optional[LostDriver]:
        """Why the driver counts as gone, once decided."""
        return self._lost

    def gate(self, beat: Heartbeat) -> None:
        """Called with every beat, in the training thread: raises
        :class:`DriverLostError` once the driver is gone; before a checkpoint
        is written or committed, the driver is checked there and then."""
        if self._lost is None and beat.phase == CHECKPOINT_PHASE:
            self._decide(self.lease.lost(before_write=True))
        if self._lost is not None:
            raise DriverLostError(self.reason)

    def watch(self) -> None:
        """Run in a daemon thread: end the process once the driver is gone."""
        while self._lost is None:
            self._decide(self.lease.lost())
            if self._lost is None:
                self.sleep(self.check_every_s)
        self.lease.say(f"{self.reason}; stopping")
        if not self._lost.confirmed:
            # The driver may still be there: let the training end with the reason, so that it reads why.
            self.idle.wait(timeout=self.lease.lease_s)
            self.sleep(REPLY_GRACE_S)
        self.exit(EXIT_DRIVER_LOST)

    def _decide(self, lost: Optional[LostDriver]) -> None:
        # Both threads decide; the first verdict stands (never undone by a later None).
        if lost is not None and self._lost is None:
            self._lost = lost


@dataclass(frozen=True)
class CheckDriverBeforeCommit:
    """A forked rank's reporter wrap (runmgr/agents/rank_processes.py): before the rank writes or
    commits a checkpoint, it checks its driver there and then, as a rank actor's gate does, so
    that the run's durable state never advances without a driver.

    The rank's node agent holds the lease (renewed by the answers to its pushes) and stops its
    ranks when the driver is gone (runmgr/workers/node_agent.py); in the rank's own process
    only what it can see for itself counts: a driver on this machine whose process ended."""

    driver: DriverIdentity

    def __call__(self, reporter: Reporter, plan: object) -> Reporter:
        return _DriverCheckingReporter(reporter, self.driver)


class _DriverCheckingReporter:
    """Passes every report on; a ``checkpoint`` beat raises :class:`DriverLostError` once the
    driver is known gone."""

    def __init__(self, reporter: Reporter, driver: DriverIdentity) -> None:
        self.reporter = reporter
        self.driver = driver
        self._self_stop: Optional[SelfStop] = None

    def started(self, report) -> None:
        self.reporter.started(report)

    def step(self, report) -> None:
        self.reporter.step(report)

    def checkpoint(self, report) -> None:
        self.reporter.checkpoint(report)

    def local_norms(self, report) -> None:
        self.reporter.local_norms(report)

    def heartbeat(self, beat: Heartbeat) -> None:
        if self._self_stop is None:  # the lease never runs out here: the agent keeps it
            self._self_stop = SelfStop(DriverLease(float("inf"), self.driver), beat.rank)
        self._self_stop.gate(beat)
        self.reporter.heartbeat(beat)
