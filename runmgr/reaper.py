"""No process of a run's own local Ray outlives its driver.

A local Ray is started by the driver, but only its GCS and raylets die with
it: the raylets' children (Ray's DashboardAgent and RuntimeEnvAgent, the
workers, the device pollers) are re-parented to pid 1 and live on for a
minute or two, waiting for a GCS that is gone. So with a local Ray the
driver also starts this module as a small process of its own (in its own
session: a Ctrl-C in the terminal does not reach it) whose stdin is a pipe
that only the driver writes to. The pipe closes when the driver exits,
however it exits (``kill -9`` included), or when the driver closes it at
disconnect; the reaper then kills every process of that Ray and exits.

A process is the run's Ray's when it holds a file inside the Ray session
directory open for writing: every Ray process writes its logs there (GCS,
raylets, monitors, agents, workers, and what they start). A session directory
belongs to one start of Ray, so the Rays of other people on the same machine
are never touched, nor is a reader of the logs (``tail -f``). Standard library
only: it starts in a blink and needs nothing else of runmgr.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Collection, Iterator, Optional

PROC = Path("/proc")
REAP_ROUNDS = 50
"""Kill rounds at most: a raylet may start a worker while it is being killed."""
ROUND_PAUSE_S = 0.1
WAIT_FOR_REAPER_S = 30.0
"""How long the driver waits for the reaper at disconnect (it takes well under a second)."""


def _inside(path: str, session_dir: str) -> bool:
    return path == session_dir or path.startswith(session_dir + "/")


def _writes_into_session(pid: int, session_dir: str, proc: Path) -> bool:
    """An open file inside the session directory, open for writing (a Ray process's log)."""
    fd_dir = proc / str(pid) / "fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:  # gone, or not ours to look into
        return False
    for fd in fds:
        try:
            if _inside(os.readlink(fd_dir / fd), session_dir) and _open_for_writing(proc / str(pid) / "fdinfo" / fd):
                return True
        except OSError:  # closed meanwhile
            continue
    return False


def _open_for_writing(fdinfo: Path) -> bool:
    for line in fdinfo.read_text().splitlines():
        if line.startswith("flags:"):
            return int(line.split()[1], 8) & (os.O_WRONLY | os.O_RDWR) != 0
    return False


def _pids(proc: Path) -> Iterator[int]:
    for entry in os.listdir(proc):
        if entry.isdigit():
            yield int(entry)


def session_processes(session_dir: str, spare: Collection[int] = (), proc: Path = PROC) -> list[int]:
    """Pids of the processes of the Ray whose session directory is ``session_dir``, except ``spare``."""
    session_dir = os.path.realpath(session_dir)
    return [pid for pid in _pids(proc) if pid not in spare and _writes_into_session(pid, session_dir, proc)]


def reap(session_dir: str, spare: Collection[int] = (), proc: Path = PROC) -> list[int]:
    """SIGKILL every process of that Ray until none is left; the pids killed."""
    spare = {os.getpid(), *spare}
    killed: list[int] = []
    for _ in range(REAP_ROUNDS):
        found = session_processes(session_dir, spare, proc)
        if not found:
            break
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
        time.sleep(ROUND_PAUSE_S)
    return killed


def main(argv: Optional[list[str]] = None) -> int:
    """``python -m runmgr.reaper SESSION_DIR DRIVER_PID``: wait for stdin to close, then reap."""
    session_dir, driver_pid = (argv if argv is not None else sys.argv[1:])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver's Ctrl-C is the driver's to handle
    while sys.stdin.buffer.read(4096):
        pass  # nothing is ever written: only the end of the pipe matters
    # A driver that closed the pipe on purpose is alive and spared; a dead one needs no sparing.
    reap(session_dir, spare={int(driver_pid)})
    return 0


class Reaper:
    """The driver's end of a reaper process."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process = process

    @classmethod
    def start(cls, session_dir: str) -> "Reaper":
        """Start the reaper of the Ray of ``session_dir``, for this process as its driver."""
        process = subprocess.Popen(
            [sys.executable, "-m", "runmgr.reaper", os.path.realpath(session_dir), str(os.getpid())],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True)
        return cls(process)

    def reap(self, timeout_s: float = WAIT_FOR_REAPER_S) -> None:
        """Have every process of the Ray killed (except this one) and wait until it is done."""
        if self.process.stdin is not None and not self.process.stdin.closed:
            self.process.stdin.close()
        self.process.wait(timeout=timeout_s)


if __name__ == "__main__":
    sys.exit(main())
