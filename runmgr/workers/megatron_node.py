"""One node of a Megatron-style sub-run: a Ray actor that starts the node's
``torchrun`` and keeps what it prints until the driver drains it.

The command runs in its own session (so that stopping it reaches every
process it started) with a parent-death signal (a node actor that dies takes
its torchrun along). A reader thread keeps every line with its arrival time.
Like a rank of the built-in trainer (runmgr/workers/actor.py), the node runs
only while its driver lives: each drain renews the lease, and a node whose
driver is gone stops its processes and ends itself, so a crashed driver
leaves no process behind. Given a device poll, it reads its node's devices
itself, as a built-in trainer's node agent does (runmgr/workers/devicepoll.py's
:class:`HeldNodePoll`, in a thread), and each drain returns the readings: no
poller actor runs beside it.
"""

from __future__ import annotations

import codecs
import ctypes
import io
import locale
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

import ray

from runmgr.config.argv import flag_value
from runmgr.ports import rendezvous_port
from runmgr.stacks import dump_pid, find_py_spy
from runmgr.workers import proctree
from runmgr.workers.devicepoll import DevicePollSettings, HeldNodePoll
from runmgr.workers.lease import DriverIdentity, DriverLease, SelfStop, ray_job_alive

MAX_BUFFERED_LINES = 200_000
"""Lines kept for a driver that does not drain (the oldest are dropped)."""
TAIL_LINES = 200
"""Last lines kept for a failure's text."""
TRACKER_FLAG = "--result-rejected-tracker-filename"
STOP_CHECK_S = 0.05
LOST_DRIVER_GRACE_S = 2.0
"""SIGTERM to SIGKILL when the driver is gone: nobody waits for a checkpoint to finish."""
OUTPUT_SETTLE_S = 2.0
"""After the command ended, once everything in the pipe is read: how long a process it left
behind may keep the pipe open before the exit is reported without what it prints later."""
OUTPUT_LIMIT_S = 60.0
"""After the command ended: the most its output is read for (a process left behind that
prints without pause would otherwise hold the exit back for ever)."""
READ_BYTES = 65536
PR_SET_PDEATHSIG = 1


def _parent_death_signal() -> Callable[[], None]:
    """``preexec_fn`` giving the child SIGTERM when the thread that started it ends.
    libc and its prctl are looked up here, before the fork: the child then only
    calls them (nothing to import or allocate between fork and exec)."""
    if not sys.platform.startswith("linux"):
        return lambda: None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os.kill(os.getpid(), signal.SIGTERM)
    return arm


class _LineDecoder:
    """Bytes of the pipe into lines of text as ``text=True`` read them: the locale's encoding,
    undecodable bytes replaced, ``\\r\\n`` and ``\\r`` ending a line as ``\\n`` does."""

    def __init__(self) -> None:
        decoder = codecs.getincrementaldecoder(locale.getpreferredencoding(False))(errors="replace")
        self._decoder = io.IncrementalNewlineDecoder(decoder, translate=True)
        self._partial = ""

    def lines(self, chunk: bytes) -> list[str]:
        """The lines ``chunk`` completes (a line's start may have come in an earlier one)."""
        *done, self._partial = (self._partial + self._decoder.decode(chunk)).split("\n")
        return done

    def rest(self) -> list[str]:
        """At the pipe's end: the last line, if it had no newline."""
        last = self._partial + self._decoder.decode(b"", final=True)
        self._partial = ""
        return [line for line in last.split("\n") if line] if last else []


class MegatronNode:
    """A node of the sub-run; one actor per node, created by :class:`MegatronWorkerGroup`."""

    def __init__(self, node_rank: int, lease_s: float, driver: Optional[DriverIdentity] = None,
                 exit: Callable[[int], None] = os._exit,
                 job_alive: Callable[[], Optional[bool]] = ray_job_alive,
                 device_poll: Optional[DevicePollSettings] = None, node: str = "") -> None:
        """``driver``: who drives this node (None: the lease alone decides); ``exit``: how
        the process ends once its driver is gone (after its processes are stopped);
        ``device_poll``: how this node's devices are read (None: they are not), the readings
        named ``node`` (the start of its Ray id) and returned by :meth:`drain`."""
        self.node_rank = node_rank
        self.lease = DriverLease(lease_s, driver, job_alive=job_alive)
        self._exit = exit
        self.self_stop = SelfStop(self.lease, node_rank, exit=self._stop_then_exit)
        self._cond = threading.Condition()
        self._lines: deque[tuple[float, str]] = deque(maxlen=MAX_BUFFERED_LINES)
        self._tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._proc: Optional[subprocess.Popen] = None
        self._exit_code: Optional[int] = None
        self._rank_pids: dict[int, int] = {}
        self._groups: set[int] = set()
        self._tracker: Optional[tuple[Path, int]] = None
        threading.Thread(target=self.self_stop.watch, name="driver-lease", daemon=True).start()
        self._device_poll = HeldNodePoll(node, device_poll) if device_poll is not None else None
        """This node's device readings, kept until a drain takes them (between sub-runs too)."""

    def reset(self) -> None:
        """Ready for the next sub-run's command (the last one was stopped): its lines, exit code,
        ranks and process groups forgotten, the lease renewed."""
        self.lease.renew()
        with self._cond:
            self._proc = None
            self._exit_code = None
            self._lines.clear()
            self._tail.clear()
        self._rank_pids = {}
        self._groups = set()
        self._tracker = None

    def describe(self) -> dict:
        context = ray.get_runtime_context()
        return {"node_id": context.get_node_id(), "node_ip": ray.util.get_node_ip_address(), "pid": os.getpid()}

    def reserve_port(self) -> int:
        """A free TCP port on this node for torchrun's rendezvous."""
        return rendezvous_port()

    def launch(self, argv: Sequence[str], env: Mapping[str, str], cwd: Optional[str] = None) -> int:
        """Start the node's command (``env`` added to this process's environment); its pid.
        Started from a thread of its own that lives as long as the command, since the
        parent-death signal follows the starting thread, not the process."""
        workdir = cwd if cwd is not None and Path(cwd).is_dir() else None
        tracker = flag_value(argv, TRACKER_FLAG)
        if tracker is not None:
            path = Path(workdir or ".", tracker)
            self._tracker = (path, path.stat().st_size if path.exists() else 0)
        # Unbuffered: a rank's lines reach the reader as printed, so their arrival times mean something.
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **env}
        started: dict = {}
        ready = threading.Event()
        threading.Thread(target=self._run, args=(list(argv), full_env, workdir, started, ready),
                         name="megatron-node", daemon=True).start()
        ready.wait()
        if "error" in started:
            raise started["error"]
        return started["pid"]

    def _run(self, argv: list[str], env: dict, cwd: Optional[str], started: dict, ready: threading.Event) -> None:
        try:
            proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, start_new_session=True,
                                    preexec_fn=_parent_death_signal())
        except OSError as exc:
            started["error"] = exc
            ready.set()
            return
        self._proc = proc
        self._groups.add(proc.pid)  # a new session: its group id is its pid
        started["pid"] = proc.pid
        ready.set()
        ended_r, ended_w = os.pipe()  # the reader waits on the output and on this: no polling while the command runs
        reader = threading.Thread(target=self._read, args=(proc, ended_r), name="megatron-output", daemon=True)
        reader.start()
        code = proc.wait()
        os.close(ended_w)  # the command ended: the reader's select wakes
        reader.join()  # every line printed before the end is kept before the exit is told
        os.close(ended_r)
        with self._cond:
            if self._proc is proc:  # not a command of an earlier sub-run, ended after a reset
                self._exit_code = code
            self._cond.notify_all()

    def _read(self, proc: subprocess.Popen, ended: int) -> None:
        """Keep the command's lines until the pipe's end; once the command ended, until the pipe
        is empty and a process it left behind had ``OUTPUT_SETTLE_S`` to let it end. The pipe
        is found empty only by this thread, which keeps what it reads before it looks again: a
        line printed before the end is never left unread, however slowly this thread is run
        (a wait on the clock alone could leave them unread on a loaded machine)."""
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        text = _LineDecoder()
        ended_at: Optional[float] = None
        while True:
            if ended_at is None and select.select([ended], [], [], 0)[0]:
                ended_at = time.monotonic()  # seen before the look below: what it finds empty was all read
            since_end = time.monotonic() - ended_at if ended_at is not None else 0.0
            waiting_on = [fd] if ended_at is not None else [fd, ended]
            ready = select.select(waiting_on, [], [], STOP_CHECK_S if ended_at is not None else None)[0]
            if fd in ready:
                chunk = os.read(fd, READ_BYTES)
                if not chunk:
                    break  # every process holding the pipe closed it
                for line in text.lines(chunk):
                    self._keep(line, proc)
                if since_end >= OUTPUT_LIMIT_S:
                    break
            elif not ready and since_end >= OUTPUT_SETTLE_S:
                break
        for line in text.rest():
            self._keep(line, proc)
        proc.stdout.close()  # a kept node runs many commands: no pipe left open per command

    def _keep(self, line: str, proc: subprocess.Popen) -> None:
        with self._cond:
            if self._proc is not proc:
                return  # a process of an earlier sub-run still printing after the reset
            self._lines.append((time.time(), line))
            self._tail.append(line)

    def rank_pids(self, expected: int, timeout_s: float) -> dict[int, int]:
        """``{global rank: pid}`` of torchrun's workers (found by the RANK torchrun sets in
        their environment), once ``expected`` are there, the command ended, or after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while self._proc is not None and self._exit_code is None:
            for pid in proctree.children(self._proc.pid):
                rank = proctree.environment(pid).get("RANK")
                group = proctree.group_of(pid)
                if rank is not None and rank.isdigit():
                    self._rank_pids[int(rank)] = pid
                    if group is not None:
                        self._groups.add(group)  # torchrun starts each worker in a session of its own
            if len(self._rank_pids) >= expected or time.monotonic() >= deadline:
                break
            time.sleep(STOP_CHECK_S)
        return dict(self._rank_pids)

    def drain(self, wait_s: float) -> dict:
        """New lines (arrival time, text) and device readings; once the command ended, its exit
        code, the tracker lines appended since the start and the output's tail (kept even when
        the buffer dropped lines). Waits up to ``wait_s`` for the end."""
        self.lease.renew()
        with self._cond:
            self._cond.wait_for(lambda: self._exit_code is not None, timeout=wait_s)
            lines = list(self._lines)
            self._lines.clear()
            code = self._exit_code
        devices = self._device_poll.take() if self._device_poll is not None else ()
        if code is None:
            return {"lines": lines, "devices": devices, "exit": None, "tracker": [], "tail": []}
        return {"lines": lines, "devices": devices, "exit": code, "tracker": self.tracker_lines(),
                "tail": self.tail()}

    def tail(self) -> list[str]:
        with self._cond:
            return list(self._tail)

    def tracker_lines(self) -> list[str]:
        """Lines appended to the rerun machine's tracker file during this sub-run."""
        if self._tracker is None or not self._tracker[0].exists():
            return []
        path, offset = self._tracker
        with path.open("rb") as handle:
            handle.seek(offset)
            return [line for line in handle.read().decode(errors="replace").splitlines() if line.strip()]

    def exit_status(self) -> Optional[int]:
        """The command's exit code (negative: the signal that ended it); None while it runs."""
        return self._exit_code

    def stop(self, grace_s: float) -> Optional[int]:
        """SIGTERM to every process group the command made, SIGKILL to what is left
        after ``grace_s``; returns its exit code once reaped (None if never started)."""
        if self._proc is None:
            return None
        targets = self._signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while any(proctree.alive(pid) for pid in targets) and time.monotonic() < deadline:
            time.sleep(STOP_CHECK_S)
        self._signal(signal.SIGKILL)
        return self._proc.wait()

    def _signal(self, signum: int) -> list[int]:
        """Send ``signum`` to the command, its descendants and every group they were seen in."""
        pids = [self._proc.pid, *proctree.descendants(self._proc.pid)] if self._proc is not None else []
        self._groups |= {group for group in map(proctree.group_of, pids) if group is not None}
        for group in sorted(self._groups):
            try:
                os.killpg(group, signum)
            except ProcessLookupError:
                pass  # every process of that group is gone
        for pid in pids:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass
        return pids

    def dump_stacks(self) -> dict[int, str]:
        """``{rank: text}``: each rank's Python stacks, dumped with py-spy on this node."""
        py_spy = find_py_spy()
        return {rank: f"rank {rank}  pid {pid}  node rank {self.node_rank}\n" + dump_pid(py_spy, pid)
                for rank, pid in sorted(self._rank_pids.items())}

    def _stop_then_exit(self, code: int) -> None:
        self.stop(LOST_DRIVER_GRACE_S)
        self._exit(code)


RemoteMegatronNode = ray.remote(max_concurrency=4, max_restarts=0)(MegatronNode)
