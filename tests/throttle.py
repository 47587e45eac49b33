"""Slow a process (or a process tree) down for real: a CPU cgroup capped at a fraction of one
CPU (cgroup v1 ``cpu.cfs_quota_us`` or v2 ``cpu.max``). Children forked later
inherit the cgroup, so capping a raylet caps the workers it starts. A starved process
that costs the machine nothing: busy loops beside it would starve every other test too."""

from __future__ import annotations

import os
import time
from pathlib import Path

V1_ROOT = Path("/sys/fs/cgroup/cpu")
V2_ROOT = Path("/sys/fs/cgroup")


def _root() -> tuple[Path, int] | None:
    if (V2_ROOT / "cgroup.controllers").is_file() and "cpu" in (V2_ROOT / "cgroup.controllers").read_text().split():
        return V2_ROOT, 2
    if (V1_ROOT / "cpu.cfs_quota_us").is_file():
        return V1_ROOT, 1
    return None


def available() -> bool:
    found = _root()
    return found is not None and os.access(found[0], os.W_OK)


def _tree(pid: int) -> list[int]:
    import psutil

    root = psutil.Process(pid)
    return [root.pid] + [child.pid for child in root.children(recursive=True)]


class CpuThrottle:
    """``with CpuThrottle("name", 0.1) as cap: cap.add_tree(pid)``."""

    def __init__(self, name: str, fraction: float, period_us: int = 20_000) -> None:
        found = _root()
        assert found is not None, "no writable CPU cgroup on this machine"
        self.root, self.version = found
        self.path = self.root / name
        self.quota_us = max(1000, int(fraction * period_us))
        self.period_us = period_us

    def __enter__(self) -> "CpuThrottle":
        self.path.mkdir()
        if self.version == 1:
            (self.path / "cpu.cfs_period_us").write_text(str(self.period_us))
            (self.path / "cpu.cfs_quota_us").write_text(str(self.quota_us))
        else:
            (self.path / "cpu.max").write_text(f"{self.quota_us} {self.period_us}")
        return self

    def add_tree(self, pid: int) -> None:
        for member in _tree(pid):
            self.add(member)

    def add(self, pid: int) -> None:
        """Cap ``pid`` (every thread of it; the children it already has keep their share)."""
        try:
            (self.path / "cgroup.procs").write_text(str(pid))
        except ProcessLookupError:
            pass  # it ended meanwhile

    def __exit__(self, *exc) -> None:
        deadline = time.time() + 10
        while time.time() < deadline:
            for pid in (self.path / "cgroup.procs").read_text().split():
                try:
                    (self.root / "cgroup.procs").write_text(pid)
                except (ProcessLookupError, OSError):
                    pass
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.2)
