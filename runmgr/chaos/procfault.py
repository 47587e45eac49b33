"""Signals to a real process: kill it, stop it, or make it a straggler.

Runs on the node where the process lives. The long-running parts (a
stop/continue duty cycle, the safety net that resumes a stopped process)
run in a detached helper process, started with :func:`spawn_helper`, so
they outlive the driver: a driver killed mid-fault never leaves a worker
stopped for good. The helper is this file run as a script (stdlib only, so
it starts fast and needs nothing else on the node)::

    python procfault.py resume-after PID SECONDS
    python procfault.py duty-cycle PID FACTOR PERIOD_S DURATION_S
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Callable, Sequence

POLL_S = 0.25
"""How often a helper checks that its target still exists."""


def alive(pid: int) -> bool:
    """True while ``pid`` exists (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return process_state(pid) not in ("Z", "X", None)


def process_state(pid: int) -> str | None:
    """The one-letter state of ``/proc/PID/stat`` (R, S, T, Z, ...), None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            text = handle.read()
    except FileNotFoundError:
        return None
    # The command name may hold spaces and parentheses: the state follows the last ')'.
    return text[text.rindex(")") + 2]


def send(pid: int, signum: int) -> None:
    """Send ``signum`` to ``pid``; ProcessLookupError when it is gone."""
    os.kill(pid, signum)


def resume_after(pid: int, after_s: float, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
    """Wait ``after_s`` (returning early once ``pid`` is gone), then SIGCONT it."""
    deadline = clock() + after_s
    while clock() < deadline:
        if not alive(pid):
            return
        sleep(min(POLL_S, max(0.0, deadline - clock())))
    _continue(pid)


def duty_cycle(pid: int, factor: float, period_s: float, duration_s: float,
               clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> int:
    """Let ``pid`` run 1/``factor`` of each period and stop it for the rest, for
    ``duration_s``; always leaves it running. Returns the cycles done."""
    run_s = period_s / factor
    stop_s = period_s - run_s
    deadline = clock() + duration_s
    cycles = 0
    try:
        while clock() < deadline:
            os.kill(pid, signal.SIGSTOP)
            sleep(stop_s)
            os.kill(pid, signal.SIGCONT)
            sleep(run_s)
            cycles += 1
    except ProcessLookupError:
        return cycles
    finally:
        _continue(pid)
    return cycles


def _continue(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass  # gone: nothing left to resume


def spawn_helper(args: Sequence[str]) -> subprocess.Popen:
    """Start this file as a detached helper (own session: it survives the driver)."""
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), *map(str, args)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, close_fds=True)


def main(argv: Sequence[str]) -> int:
    # SIGTERM must not leave the target stopped: run the finally clauses.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    if len(argv) == 3 and argv[0] == "resume-after":
        resume_after(int(argv[1]), float(argv[2]))
        return 0
    if len(argv) == 5 and argv[0] == "duty-cycle":
        duty_cycle(int(argv[1]), float(argv[2]), float(argv[3]), float(argv[4]))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
