"""The processes of a test's own run, found through its driver's process tree
(never by name across the machine: other people's Rays run here too)."""

from __future__ import annotations

import os
import time
from pathlib import Path

Process = tuple[int, int]
"""(pid, start time in clock ticks): a pid the kernel hands out again is another process."""


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time) of a live process, None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    if fields[0] == "Z":  # a zombie has ended; only its parent's wait is missing
        return None
    return int(fields[1]), int(fields[19])


def descendants(root: int) -> dict[Process, str]:
    """Every live process below ``root``, with its name."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) is not None:
            children.setdefault(stat[0], []).append(int(entry))
    found: dict[Process, str] = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        stat = _stat(pid)
        if stat is not None:
            found[(pid, stat[1])] = name_of(pid)
            todo += children.get(pid, [])
    return found


def name_of(pid: int) -> str:
    """The program's name, or the title Ray gives its processes (``ray::DashboardAgent``)."""
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return "?"
    return os.path.basename(argv0.split(" ")[0]) if argv0.startswith("/") else argv0.strip()


def alive(process: Process) -> bool:
    stat = _stat(process[0])
    return stat is not None and stat[1] == process[1]


def survivors_at(processes: dict[Process, str], deadline: float) -> dict[Process, str]:
    """The processes still alive at ``deadline`` (returns as soon as none is)."""
    while True:
        left = {p: name for p, name in processes.items() if alive(p)}
        if not left or time.time() >= deadline:
            return left
        time.sleep(0.2)


def child_named(parent: int, name: str) -> int:
    """The pid of ``parent``'s child called ``name`` (e.g. the local Ray's gcs_server)."""
    return next(pid for (pid, _), comm in descendants(parent).items()
                if comm == name and _stat(pid) is not None and _stat(pid)[0] == parent)
