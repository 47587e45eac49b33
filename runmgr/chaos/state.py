"""What chaos has already done to a lineage: ``<run dir>/chaos_state.json``.

Each fault fires once per lineage. A relaunched driver reads this file and
does not fire a fault again; the file also remembers what must be undone if
a driver dies mid-fault (a read-only mount it made). Written atomically
(temp file, fsync, rename, fsync of the directory), so a crash leaves either
the old or the new state, never half of one.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from runmgr.errors import RunStateError

STATE_FILE = "chaos_state.json"


class ChaosStateError(RunStateError):
    """chaos_state.json exists but cannot be read."""


class ChaosState:
    """Fired faults (label -> record) and mounts to undo, kept in the run directory."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / STATE_FILE
        data = self._read()
        self.fired: dict[str, dict] = dict(data.get("fired", {}))
        self.mounts: list[str] = list(data.get("mounts", []))
        self.intended_lr: float | None = data.get("intended_lr")
        """optim.lr as the user meant it, before an lr_blowup override replaced it."""
        self.unscheduled: list[str] = list(data.get("unscheduled", []))
        """Sub-runs that ended with no fault of the schedule in them: what ``at_subrun`` skips."""

    @property
    def shift(self) -> int:
        """How many sub-runs later than their number a fault keyed to a sub-run comes."""
        return len(self.unscheduled)

    def mark_unscheduled(self, subrun: str) -> None:
        if subrun not in self.unscheduled:
            self.unscheduled.append(subrun)
            self.save()

    def _read(self) -> dict:
        if not self.path.exists():
            return {}
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError) as exc:
            raise ChaosStateError(f"{self.path} cannot be read ({exc}); delete it to let every chaos fault "
                                  f"fire again, or restore it") from None
        if not isinstance(data, dict):
            raise ChaosStateError(f"{self.path} does not hold a JSON object; delete or restore it")
        return data

    def has_fired(self, label: str) -> bool:
        return label in self.fired

    def mark_fired(self, label: str, record: dict) -> None:
        self.fired[label] = record
        self.save()

    def add_mount(self, path: str) -> None:
        if path not in self.mounts:
            self.mounts.append(path)
            self.save()

    def remove_mount(self, path: str) -> None:
        if path in self.mounts:
            self.mounts.remove(path)
            self.save()

    def remember_intended_lr(self, lr: float) -> float:
        """Keep the first value seen: a relaunch's config already carries the mistaken LR."""
        if self.intended_lr is None:
            self.intended_lr = lr
            self.save()
        return self.intended_lr

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".chaos_state.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as handle:
                json.dump({"fired": self.fired, "mounts": self.mounts, "intended_lr": self.intended_lr,
                           "unscheduled": self.unscheduled}, handle, indent=1, sort_keys=True)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
