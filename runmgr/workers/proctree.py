"""A process's descendants, environment and process group, read from /proc:
what a node needs to find its ranks among torchrun's children and to leave
no process behind when it stops them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from runmgr.workers.lease import process_start_ticks

_PROC = Path("/proc")


def alive(pid: int) -> bool:
    """True while ``pid`` is a live process (a zombie counts as gone)."""
    return process_start_ticks(pid) is not None


def parent_of(pid: int) -> Optional[int]:
    """The parent pid of ``pid`` (stat(5) field 4), None when it is gone."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(stat[stat.rindex(")") + 2:].split()[1])


def children(pid: int) -> list[int]:
    """The live direct children of ``pid``."""
    found = []
    for entry in _PROC.iterdir():
        if entry.name.isdigit() and parent_of(int(entry.name)) == pid and alive(int(entry.name)):
            found.append(int(entry.name))
    return sorted(found)


def descendants(pid: int) -> list[int]:
    """Every live process under ``pid`` (children, their children...)."""
    parents: dict[int, int] = {}
    for entry in _PROC.iterdir():
        if entry.name.isdigit():
            parent = parent_of(int(entry.name))
            if parent is not None:
                parents[int(entry.name)] = parent
    found, frontier = [], {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier and child not in found}
        found += sorted(frontier)
    return [p for p in found if alive(p)]


def environment(pid: int) -> dict[str, str]:
    """The environment ``pid`` started with; empty when it is gone or not ours to read."""
    try:
        raw = (_PROC / str(pid) / "environ").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return {}
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if item)
    return {key: value for key, _, value in pairs}


def group_of(pid: int) -> Optional[int]:
    """The process group of ``pid``; None when it is gone."""
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None
