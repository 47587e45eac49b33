"""One driver per run directory, enforced with an advisory lock that the
kernel releases when the driver dies (even by kill -9)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from runmgr.errors import RunStateError

LOCK_FILE = "driver.lock"


class RunDirLock:
    """Held for the whole life of a driver."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / LOCK_FILE
        self._fd: int | None = None

    def __enter__(self) -> "RunDirLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
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
