"""Run a command that may hang (a wedged driver, a dead NFS server) and come
back by its deadline whatever it does.

The command runs in its own session so that the whole process group (a shell
script and its children) is killed at the deadline. A process stuck in an
uninterruptible kernel wait cannot be reaped; we stop waiting for it after a
short grace period instead of hanging with it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Literal, Mapping, Optional, Sequence

Status = Literal["ok", "failed", "timeout", "absent"]
_GRACE_S = 1.0


@dataclass(frozen=True)
class CommandResult:
    """What came back from a bounded command."""

    argv: tuple[str, ...]
    status: Status
    """ok: exit 0; failed: other exit; timeout: killed at the deadline; absent: not on PATH."""
    returncode: Optional[int]
    stdout: str
    stderr: str
    seconds: float

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    @property
    def command(self) -> str:
        return " ".join(self.argv)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # it ended between the deadline and the kill


def run_bounded(argv: Sequence[str], timeout_s: float,
                env: Optional[Mapping[str, str]] = None,
                stdin_data: Optional[str] = None) -> CommandResult:
    """Run ``argv``; return by ``timeout_s`` (plus a short grace) in every case."""
    start = time.monotonic()
    proc = subprocess.Popen(
        list(argv), stdin=subprocess.PIPE if stdin_data is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
        env=dict(env) if env is not None else None, start_new_session=True)
    try:
        out, err = proc.communicate(stdin_data, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        try:  # collect what it printed before the deadline (tells where it hung)
            out, err = proc.communicate(timeout=_GRACE_S)
        except subprocess.TimeoutExpired:
            out, err = "", ""  # unkillable (D state) or a stray holds the pipe: give up
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        return CommandResult(tuple(argv), "timeout", None, out or "", err or "",
                             time.monotonic() - start)
    status: Status = "ok" if proc.returncode == 0 else "failed"
    return CommandResult(tuple(argv), status, proc.returncode, out, err,
                         time.monotonic() - start)


def _drain(pipe, into: list[str], first_line: threading.Event) -> None:
    for line in pipe:
        into.append(line)
        first_line.set()
    first_line.set()  # end of output counts as started: the wait below then sees the exit


def run_bounded_from_first_line(argv: Sequence[str], timeout_s: float,
                                start_s: float) -> CommandResult:
    """Run ``argv``; its ``timeout_s`` counts from its first line on stdout.

    For a worker whose deadline bounds what it does, not the interpreter's start: a probe
    killed before it began would blame the thing it was sent to test. A command silent for
    ``start_s`` comes back ``timeout`` with no output.
    """
    begin = time.monotonic()
    proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, errors="replace",
                            start_new_session=True)
    out: list[str] = []
    err: list[str] = []
    started = threading.Event()
    readers = [threading.Thread(target=_drain, args=(proc.stdout, out, started), daemon=True),
               threading.Thread(target=_drain, args=(proc.stderr, err, threading.Event()),
                                daemon=True)]
    for reader in readers:
        reader.start()
    timed_out = not started.wait(start_s)
    if not timed_out:
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
    if timed_out:
        _kill_group(proc)
    for reader in readers:
        # A process stuck in the kernel (D state) keeps its pipes open: stop waiting for it.
        reader.join(_GRACE_S)
    seconds = time.monotonic() - begin
    if timed_out:
        return CommandResult(tuple(argv), "timeout", None, "".join(out), "".join(err), seconds)
    status: Status = "ok" if proc.returncode == 0 else "failed"
    return CommandResult(tuple(argv), status, proc.returncode, "".join(out), "".join(err), seconds)


def run_tool(name: str, args: Sequence[str], timeout_s: float,
             path: Optional[str] = None) -> CommandResult:
    """Run a vendor tool found by name on ``path`` (default: $PATH).

    A tool that is not installed comes back ``absent``, not as an error: a
    CPU-only node has no npu-smi, and that is a fact, not a fault.
    """
    found = shutil.which(name, path=path)
    if found is None:
        return CommandResult((name, *args), "absent", None, "", "", 0.0)
    env = None
    if path is not None:
        env = dict(os.environ, PATH=path)
    return run_bounded([found, *args], timeout_s, env=env)
