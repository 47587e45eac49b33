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

import math
import os
import resource
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
    if pid <= 0:  # a rank that never started (pid 0): os.kill would signal a whole process group
        raise ProcessLookupError(f"pid {pid} is no process")
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
               clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
               lower: bool = True) -> int:
    """Let ``pid`` run 1/``factor`` of each period and stop it for the rest, for
    ``duration_s``, its threads lowered by :func:`nice_steps` ``(factor)`` meanwhile; always
    leaves it running. Returns the cycles done. ``lower=False``: the cycle alone (bench/straggler_slowing.py).

    Why both: a stop/continue cycle slows a process only where a core is free for it. On a
    busy machine a process stopped two thirds of the time is run first whenever continued
    (the scheduler credits a waking task), so it trains hardly slower than its peers
    (measured beside two busy loops: 1.45x for a 3x cycle); a lower priority slows it only
    where the cores are contended (1.00x idle, 2.9x there). Together: 2.9x idle, 3.75x busy."""
    run_s = period_s / factor
    stop_s = period_s - run_s
    deadline = clock() + duration_s
    cycles = 0
    lowered = lower_priority(pid, nice_steps(factor)) if lower else {}
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
        restore_priority(lowered)
    return cycles


NICE_WEIGHT_RATIO = 1.25
"""Linux's CPU weight of one nice level over the next (sched_prio_to_weight: each step ~1.25x)."""


def nice_steps(factor: float) -> int:
    """The nice increment whose CPU weight is 1/``factor`` of the process's own (3x: 5)."""
    return max(1, min(19, round(math.log(factor) / math.log(NICE_WEIGHT_RATIO))))


def lower_priority(pid: int, steps: int) -> dict[int, int]:
    """Raise the nice value of every thread of ``pid`` by ``steps`` (on Linux a nice value is a
    thread's; threads started later inherit their creator's). Returns each thread's old value."""
    old: dict[int, int] = {}
    for tid in _threads(pid):
        try:
            value = os.getpriority(os.PRIO_PROCESS, tid)
            os.setpriority(os.PRIO_PROCESS, tid, min(19, value + steps))
        except ProcessLookupError:
            continue  # the thread ended meanwhile
        except PermissionError:
            continue  # another user's process: the duty cycle alone slows it (as before)
        old[tid] = value
    return old


def restore_priority(old: dict[int, int]) -> bool:
    """Give each thread its old nice value back. Lowering a nice value needs CAP_SYS_NICE (or
    RLIMIT_NICE): without it the threads keep the raised one until they end, and this returns
    False (the injection's detail says so beforehand: :func:`can_restore_priority`)."""
    restored = True
    for tid, value in old.items():
        try:
            os.setpriority(os.PRIO_PROCESS, tid, value)
        except ProcessLookupError:
            continue
        except PermissionError:
            restored = False
    return restored


def can_restore_priority() -> bool:
    """Whether this user may lower a nice value again (root, or a soft RLIMIT_NICE that allows 0)."""
    if os.geteuid() == 0:
        return True
    soft, _ = resource.getrlimit(resource.RLIMIT_NICE)
    return soft == resource.RLIM_INFINITY or soft >= 20


def _threads(pid: int) -> list[int]:
    try:
        return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        return []


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
