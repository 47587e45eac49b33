"""A full disk under the run directory: one line and a recorded end, not a traceback.

Recording that a sub-run ended takes room (a few pages of the logbook's
write-ahead log, a new status.json), which a full disk no longer has. So the
driver holds a reserve file in the run directory while it runs
(:data:`RESERVE_BYTES`, allocated for real, not sparse). When one of its
writes fails because the disk is full (SQLite's "database or disk is full",
ENOSPC from status.json), the controller's ``finally`` stops the workers,
Ray is shut down (so no process of the run writes any more), the reserve is
deleted, and its room records the sub-run's end as ``failed`` with the
reason. A launch that cannot allocate the reserve is refused before it
writes anything else (:class:`DiskFullError`, one line, exit 2): a relaunch
while the disk is still full, or a new run on a full disk.
"""

from __future__ import annotations

import errno
import os
import shutil
import sqlite3
from pathlib import Path
from typing import Optional

from logbook import Logbook
from runmgr.errors import DiskFullError
from runmgr.observers.logbook_writer import record_stop
from runmgr.status import mark_stopped

RESERVE_FILE = ".disk_reserve"
RESERVE_BYTES = 1 << 20
"""1 MiB: a sub-run's end and the status file need a few pages; the rest is margin."""
DISK_WRITE_ERRORS = (OSError, sqlite3.OperationalError)
"""What a write on a full disk raises: to be tested with :func:`is_disk_full`."""
_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def is_disk_full(error: BaseException) -> bool:
    """True for a write refused for lack of room (or of quota)."""
    if isinstance(error, OSError):
        return error.errno in _FULL_ERRNOS
    if isinstance(error, sqlite3.OperationalError):
        return getattr(error, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or "disk is full" in str(error)
    return False


def free_space(run_dir: Path) -> str:
    """Free bytes on the disk holding ``run_dir`` (or its nearest existing parent), in words."""
    where = next((p for p in (run_dir, *run_dir.parents) if p.exists()), Path("."))
    return f"{shutil.disk_usage(where).free / 2**20:.1f} MiB free"


def check_room(run_dir: Path) -> None:
    """Refuse (DiskFullError) a launch whose disk cannot hold the reserve, before anything
    is opened or written there; a reserve a killed driver left behind still counts."""
    where = next((p for p in (run_dir, *run_dir.parents) if p.exists()), Path("."))
    if not (run_dir / RESERVE_FILE).is_file() and shutil.disk_usage(where).free < RESERVE_BYTES:
        raise DiskFullError(refusal(run_dir))


def refusal(run_dir: Path, error: Optional[BaseException] = None) -> str:
    """The one line of a launch refused for a full disk."""
    cause = f" ({error})" if error is not None else ""
    return (f"the disk holding {run_dir} is full{cause}; {free_space(run_dir)}, and a launch needs "
            f"{RESERVE_BYTES / 2**20:.0f} MiB to hold in reserve: free space there, then run the same "
            f"`runmgr launch` again (it resumes from the last checkpoint)")


class DiskReserve:
    """The room kept in the run directory to record a sub-run's end on a full disk."""

    def __init__(self, run_dir: Path, size: int = RESERVE_BYTES) -> None:
        self.run_dir = run_dir
        self.path = run_dir / RESERVE_FILE
        self.size = size

    def __enter__(self) -> "DiskReserve":
        self.hold()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def hold(self) -> None:
        """Allocate the reserve (kept from a driver that was killed, or made anew);
        :class:`DiskFullError` when the disk has not that much room."""
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                _allocate(fd, self.size)
            finally:
                os.close(fd)
        except OSError as error:
            if not is_disk_full(error):
                raise
            self.release()  # what was allocated goes back: the refusal writes nothing
            raise DiskFullError(refusal(self.run_dir)) from None

    def release(self) -> None:
        """Give the room back (to record an end, or at the driver's exit)."""
        self.path.unlink(missing_ok=True)


def _allocate(fd: int, size: int) -> None:
    """Real blocks for ``size`` bytes: a sparse file would reserve nothing."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as error:
        if error.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # a file system without fallocate: write zeros
            raise
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, bytes(size))
        os.fsync(fd)


def end_on_full_disk(book: Logbook, run_dir: Path, reserve: DiskReserve, error: BaseException) -> str:
    """The workers are stopped and Ray is down: release the reserve, record the
    open sub-run's end as ``failed`` and the status file, and say so in one line."""
    reserve.release()
    what = f"the disk holding {run_dir} is full ({error})"
    advice = "free space there, then run the same `runmgr launch` again to resume from the last checkpoint"
    reason = f"{what}: the workers were stopped; {advice}"
    try:
        ended = record_stop(book, reason, end_state="failed")
        mark_stopped(run_dir, reason, state="failed")
    except DISK_WRITE_ERRORS as again:
        if not is_disk_full(again):
            raise
        return f"{what}, and its end could not be recorded (the next launch records it as abandoned); {advice}"
    where = f"sub-run {ended[0]} ended as failed at step {ended[1]}" if ended else "no sub-run was open"
    return f"{what}: {where}; {advice}"
