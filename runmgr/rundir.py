"""The run directory: one driver per run directory, enforced with an advisory
lock that the kernel releases when the driver dies (even by kill -9); and the
checks that refuse, before anything is written, a directory the run could not
use."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from logbook import LOGBOOK_FILENAME, Logbook
from runmgr.config.schema import RunConfig
from runmgr.diskspace import check_room
from runmgr.errors import RunStateError

LOCK_FILE = "driver.lock"


def check_directory(path: Path, key: str) -> None:
    """Refuse a directory the run cannot create or write, naming ``key`` (the
    setting that chose it). Writes nothing: where ``path`` does not exist yet,
    an empty directory is made in its nearest existing parent and removed
    again (``mkdir`` is the only honest test: as root, /proc and /sys pass
    ``os.access``)."""
    if path.exists() and not path.is_dir():
        raise RunStateError(f"{key} {path} is a file, not a directory: choose another {key}")
    if path.is_dir():
        if not os.access(path, os.W_OK | os.X_OK):
            raise RunStateError(f"{key} {path} is not writable: fix its permissions or choose another {key}")
        return
    parent = next(p for p in path.absolute().parents if p.exists())
    if not parent.is_dir():
        raise RunStateError(f"{key} {path} cannot be created: {parent} is a file, not a directory; choose another {key}")
    probe = parent / f".runmgr-probe-{os.getpid()}"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError as err:
        raise RunStateError(f"{key} {path} cannot be created ({err.strerror} in {parent}): "
                            f"choose another {key}") from None


def check_run_dir(config: RunConfig) -> None:
    """Refuse a launch whose run directory or checkpoint directory cannot be
    written, or whose logbook is damaged (LogbookError names the salvage
    command), before anything is written or started."""
    run_dir = config.run_dir()
    check_directory(run_dir, "run.dir" if config.run.dir else "run.name")
    check_room(run_dir)  # a full disk: its own line, before SQLite fails to open the logbook there
    if config.checkpoint.save:
        check_directory(Path(config.checkpoint.save), "checkpoint.save")
    if (run_dir / LOGBOOK_FILENAME).is_file():
        Logbook.open(run_dir, create=False).close()


class RunDirLock:
    """Held for the whole life of a driver."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / LOCK_FILE
        self._fd: int | None = None

    def __enter__(self) -> "RunDirLock":
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise RunStateError(f"cannot use the run directory {self.path.parent} ({err.strerror}): "
                                f"choose another run.dir or run.name") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise RunStateError(f"{self.path.parent} is already driven by pid {holder}: wait for it, "
                                f"or stop it before launching again") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
