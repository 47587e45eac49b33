"""A node's rank processes, forked from one server that imported the trainer once.

A rank started as a fresh process spends about 90% of its start in imports (torch,
torch.distributed.checkpoint with DTensor and sympy, torch._dynamo at the optimizer's
construction): measured here, 3.5 CPU-seconds for a fresh process against 0.2 for one forked
from a server that had them imported (bench/rank_start.py). On a node of eight ranks that is
eight imports of torch from a shared file system at every restart; here it is one per node,
for as long as the node's agent lives.

The server is the standard library's ``forkserver``: a clean process started by exec (no
thread, no torch op, no Ray in it), which imports :data:`PRELOAD` and forks one child per
rank. A child runs :func:`run_rank`: it builds its ``DistEnv``, trains through
``trainer.train`` and sends every report to its node's agent over a pipe, then its result.
It dies with the server (a parent-death signal), and the server ends when the agent does, so
a lost agent leaves no rank behind.

Ray-free: the agent that holds this (a Ray actor on a real cluster,
runmgr/workers/node_agent.py) reads what it collects and sums it up for the driver
(runmgr/agents/summary.py).
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import resource
import signal
import sys
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Literal, Mapping, Optional

from runmgr.agents.report import RankEnd
from runmgr.agents.warm_link import WAITING, PackedAnswer, PipeWarmLink, SpareReleased
from trainer.config import TrainerConfig
from trainer.plan import ResumePlan
from trainer.report import CheckpointReport, Heartbeat, LocalNormsReport, Reporter, StartReport, StepReport

WrapReporter = Callable[[Reporter, ResumePlan], Reporter]
"""What a rank's reports pass through before its pipe (the agent's check of its driver before a
checkpoint commit, chaos's pauses at a step): picklable, applied in the rank's process."""

PRELOAD = ("runmgr.agents.rank_processes", "trainer.loop", "torch._dynamo", "torch.distributed.checkpoint")
"""What the server imports once for all its children: the trainer and what torch imports
lazily at a rank's start (the compiler's front end, at the optimizer's construction)."""
StartMethod = Literal["forkserver", "spawn"]
PR_SET_PDEATHSIG = 1
READ_SETTLE_S = 5.0
"""After a rank's process ended: how long its last reports may take to be read."""
END_TEXT_CHARS = 2000
"""How much of a failed rank's traceback its end carries."""


@dataclass(frozen=True)
class RankStart:
    """What one rank process needs: plain data, pickled to the server."""

    config: TrainerConfig
    plan: ResumePlan
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    wraps: tuple[WrapReporter, ...] = ()
    """Applied to the rank's pipe reporter in order, the last outermost (as the per-rank actor
    wraps its buffer: the driver check first, chaos's pauses around it)."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Set in the rank's process before it trains: its own devices out of its node's (the
    visible-devices variable Ray sets for a per-rank actor; runmgr/placement.py names it). The
    server never starts a device runtime, so the child's is the first to read it."""
    warm: bool = False
    """Train with a warm link over the pipe (runmgr/agents/warm_link.py): a peer's death is
    survived in this process when the agent answers where the group re-forms."""
    spare: bool = False
    """A warm spare: build the model, wait in the warm link to be named, then train as the rank
    named (``rank`` is then the spare's key, negative: :func:`spare_key`)."""
    buddy_offset: int = 1
    """Where this rank's snapshot buddy sits, ranks on (trainer/warm.py)."""


def spare_key(index: int) -> int:
    """The key a node's ``index``-th spare process is known by until a recovery names its rank:
    negative, never a rank."""
    return -1 - index


class PipeReporter:
    """The trainer's :class:`trainer.report.Reporter` in a forked rank: each report to the agent."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def started(self, report: StartReport) -> None:
        self.conn.send(("started", report))

    def step(self, report: StepReport) -> None:
        self.conn.send(("step", report))

    def checkpoint(self, report: CheckpointReport) -> None:
        self.conn.send(("checkpoint", report))

    def local_norms(self, report: LocalNormsReport) -> None:
        self.conn.send(("local_norms", report))

    def heartbeat(self, beat: Heartbeat) -> None:
        self.conn.send(("heartbeat", beat))


def run_rank(start: RankStart, conn: Connection) -> None:
    """A forked rank's whole life: train, say how it ended, exit (1 after a failure)."""
    _die_with_parent()
    os.environ.update(start.env)
    from trainer import train
    from trainer.distributed import DistEnv

    env = DistEnv(rank=start.rank, world_size=start.world_size, local_rank=start.local_rank,
                  master_addr=start.master_addr, master_port=start.master_port)
    reporter: Reporter = PipeReporter(conn)
    link = PipeWarmLink(conn, start.rank, start.buddy_offset) if start.warm or start.spare else None
    try:
        # A wrap that raises is the rank's error, in its words, not a death without a word.
        for wrap in start.wraps:
            reporter = wrap(reporter, start.plan)
        if start.spare:
            assert link is not None
            result = _train_spare(start, reporter, link)
        else:
            result = train(start.config, start.plan, reporter, env, link)
    except BaseException:
        conn.send(("cpu", _cpu_seconds()))
        conn.send(("error", traceback.format_exc()[-END_TEXT_CHARS:]))
        raise
    conn.send(("cpu", _cpu_seconds()))
    conn.send(("finished", repr(result)))


def _train_spare(start: RankStart, reporter: Reporter, link: PipeWarmLink) -> object:
    """A spare's life: built, waiting, then the rank it is named (or released: a plain end)."""
    from trainer.loop import train_spare

    try:
        return train_spare(start.config, reporter, link)
    except SpareReleased:
        return "released"


def _cpu_seconds() -> float:
    """This process's CPU-seconds: since the fork for a forked rank, since the interpreter's
    start for a spawned one (its imports included)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _die_with_parent() -> None:
    """SIGKILL when the server that forked this rank ends (it ends with the agent)."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the server ended before the signal was armed
        os._exit(1)


@dataclass
class _Rank:
    process: Any
    """A ``multiprocessing`` process of the forkserver context."""
    reports: deque = field(default_factory=deque)
    said: Optional[tuple[str, str]] = None
    """("finished" or "error", text) once the rank said how it ended."""
    cpu_s: Optional[float] = None
    """The CPU-seconds its process used, said as it ended."""
    reader: Optional[threading.Thread] = None
    conn: Optional[Connection] = None
    """The agent's end of the rank's pipe: reports come up it, warm answers go down it."""
    waiting: bool = False
    """It waits in its warm link for an answer (:meth:`RankProcesses.answer`)."""


class RankProcesses:
    """The ranks of one node: started from the node's fork server, their reports collected.

    ``take`` returns each rank's reports in order as ``(kind, report)`` (the kinds of
    :class:`trainer.report.Reporter`'s methods) and ``ended`` each rank's end once, when its
    process is gone and all it sent was read."""

    def __init__(self, start_method: StartMethod = "forkserver", preload: tuple[str, ...] = PRELOAD) -> None:
        """``start_method``: ``forkserver`` (each rank forked from the server that imported
        ``preload``) or ``spawn`` (a fresh interpreter per rank: what a rank costs without the
        server, for comparison)."""
        self._context = multiprocessing.get_context(start_method)
        if start_method == "forkserver":
            self._context.set_forkserver_preload(list(preload))
        self._ranks: dict[int, _Rank] = {}
        self._reported_ends: set[int] = set()
        self._lock = threading.Lock()

    def start(self, start: RankStart) -> int:
        """Fork the rank; its pid."""
        if start.rank in self._ranks and start.rank not in self._reported_ends:
            raise ValueError(f"rank {start.rank} runs on this node already")
        # Two-way: a warm rank reads its answer from it (runmgr/agents/warm_link.py).
        receive, send = self._context.Pipe(duplex=True)
        process = self._context.Process(target=run_rank, args=(start, send), name=f"rank-{start.rank}", daemon=False)
        process.start()
        send.close()  # the child holds its end: a read returns EOF once it is gone
        rank = _Rank(process, conn=receive)
        rank.reader = threading.Thread(target=self._read, args=(rank, receive), name=f"rank-{start.rank}-reports",
                                       daemon=True)
        with self._lock:
            self._ranks[start.rank] = rank
            self._reported_ends.discard(start.rank)
        rank.reader.start()
        return process.pid

    def _read(self, rank: _Rank, receive: Connection) -> None:
        with receive:
            while True:
                try:
                    kind, payload = receive.recv()
                except EOFError:  # the rank's process is gone (ended, or killed)
                    return
                with self._lock:
                    if kind in ("finished", "error"):
                        rank.said = (kind, payload)
                    elif kind == "cpu":
                        rank.cpu_s = payload
                    else:
                        rank.waiting = rank.waiting or kind == WAITING
                        rank.reports.append((kind, payload))

    def running(self) -> set[int]:
        """The ranks (and spares, by key) whose process runs."""
        with self._lock:
            return {number for number, rank in self._ranks.items() if rank.process.exitcode is None}

    def live_pids(self) -> set[int]:
        """The pids of the processes that run (a rank's, a spare's; one a spare replaced is gone)."""
        with self._lock:
            return {rank.process.pid for rank in self._ranks.values() if rank.process.exitcode is None}

    def waiting(self) -> set[int]:
        """The ranks (and spares, by key) that wait in their warm link for an answer."""
        with self._lock:
            return {number for number, rank in self._ranks.items() if rank.waiting}

    def answer(self, key: int, rejoin: Optional[Any]) -> bool:
        """Send the rank (or spare) ``key`` waiting in its warm link where the group re-forms (a
        :class:`trainer.rejoin.Rejoin`, or one the driver pickled, :class:`PackedAnswer`; None:
        restart cold, a spare is released). False when its process is gone (its end says how)."""
        with self._lock:
            rank = self._ranks[key]
            if rank.process.exitcode is not None or rank.conn is None or rank.conn.closed:
                return False
            rank.waiting = False
            try:
                if isinstance(rejoin, PackedAnswer):
                    rejoin.send(rank.conn)
                else:
                    rank.conn.send(rejoin)
            except OSError:  # a broken pipe, or closed by its reader: it died as it was answered
                return False  # its end follows in ended()
        return True

    def rename(self, key: int, rank: int) -> None:
        """The spare ``key`` becomes ``rank`` (a recovery named it): its reports and end are
        ``rank``'s from now on. ``rank``'s own process must have ended already."""
        if rank in self._ranks:
            self._ranks[rank].process.join(timeout=READ_SETTLE_S)  # killed by the recovery: reaped first
        with self._lock:
            if rank in self._ranks and self._ranks[rank].process.exitcode is None:
                raise ValueError(f"rank {rank} still runs on this node: spare {key} cannot take it")
            self._ranks[rank] = self._ranks.pop(key)
            self._reported_ends.discard(rank)
            if key in self._reported_ends:
                self._reported_ends.discard(key)
                self._reported_ends.add(rank)

    def pids(self) -> dict[int, int]:
        return {number: rank.process.pid for number, rank in self._ranks.items()}

    def cpu_seconds(self) -> dict[int, float]:
        """The CPU-seconds of each rank that ended saying so (the server's imports not included)."""
        with self._lock:
            return {number: rank.cpu_s for number, rank in self._ranks.items() if rank.cpu_s is not None}

    def take(self) -> dict[int, list[tuple[str, object]]]:
        """Each rank's reports since the last call."""
        with self._lock:
            taken = {number: list(rank.reports) for number, rank in self._ranks.items() if rank.reports}
            for rank in self._ranks.values():
                rank.reports.clear()
        return taken

    def ended(self, wait_s: float = 0.0, now: Optional[float] = None) -> list[RankEnd]:
        """The ends not reported yet of ranks whose process is gone, waiting up to ``wait_s``
        for one when none is."""
        running = {rank.process.sentinel: rank.process for number, rank in self._ranks.items()
                   if number not in self._reported_ends and rank.process.exitcode is None}
        if wait_s > 0 and running and len(running) == len(self._ranks) - len(self._reported_ends):
            for sentinel in wait(list(running), timeout=wait_s):
                # The sentinel is ready as the process exits, a moment before it can be reaped.
                running[sentinel].join(timeout=READ_SETTLE_S)
        ends = []
        for number, rank in list(self._ranks.items()):
            if number in self._reported_ends or rank.process.exitcode is None:
                continue
            assert rank.reader is not None
            # Every report sent before the end is read first. A process the rank started could
            # hold the pipe open after it: then its end comes without them.
            rank.reader.join(timeout=READ_SETTLE_S)
            ends.append(_end_of(number, rank, time.time() if now is None else now))
            self._reported_ends.add(number)
        return ends

    def kill(self, rank: int) -> None:
        """SIGKILL the rank's process (its end follows in :meth:`ended`)."""
        self._ranks[rank].process.kill()

    def stop(self, grace_s: float) -> None:
        """SIGTERM every rank still running, SIGKILL what is left after ``grace_s``; waits for
        them. Their ends are not reported: the node is ready for the next sub-run's ranks."""
        running = [rank.process for rank in self._ranks.values() if rank.process.exitcode is None]
        for process in running:
            process.terminate()
        deadline = time.monotonic() + grace_s
        for process in running:
            process.join(timeout=max(0.0, deadline - time.monotonic()))
            if process.exitcode is None:
                process.kill()
                process.join()
        with self._lock:
            self._ranks.clear()
            self._reported_ends.clear()


def _end_of(number: int, rank: _Rank, now: float) -> RankEnd:
    code = rank.process.exitcode
    if rank.said is not None and rank.said[0] == "finished" and code == 0:
        return RankEnd(number, "finished", rank.said[1], now, code, rank.process.pid)
    if rank.said is not None and rank.said[0] == "error":
        return RankEnd(number, "error", rank.said[1], now, code, rank.process.pid)
    how = f"killed by {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
    return RankEnd(number, "died", f"rank {number}'s process ended without a word ({how})", now, code,
                   rank.process.pid)
