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
