"""A checkpoint directory that fails for real: a read-only bind mount over it.

Root ignores file permissions, so chmod cannot stop the trainer's writes; a
read-only mount does: every new file or directory under the checkpoint
directory fails with ``OSError: [Errno 30] Read-only file system`` inside the
trainer's own save (its mkdir, DCP's writes, the manifest), as when a shared
file system turns read-only after an error. Existing checkpoints stay
readable, so nothing already verified is lost, and removing the mount brings
the directory back exactly as it was. Needs CAP_SYS_ADMIN on the node.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

MS_RDONLY = 1
MS_REMOUNT = 32
MS_BIND = 4096
MNT_DETACH = 2

_LIBC = ctypes.CDLL(None, use_errno=True)


class MountPermissionError(PermissionError):
    """This process may not mount (no CAP_SYS_ADMIN): the fault cannot be injected here."""


def _check(result: int, what: str, path: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        if code == 1:  # EPERM
            raise MountPermissionError(code, f"{what} needs CAP_SYS_ADMIN (run as root in a privileged "
                                             f"container, or drop checkpoint_fail from the chaos schedule)", path)
        raise OSError(code, f"{what}: {os.strerror(code)}", path)


def make_read_only(path: str) -> None:
    """Put a read-only bind mount of ``path`` over itself (the directory is created if needed)."""
    Path(path).mkdir(parents=True, exist_ok=True)
    target = os.fsencode(path)
    _check(_LIBC.mount(target, target, None, MS_BIND, None), "bind mount", path)
    try:
        _check(_LIBC.mount(b"none", target, None, MS_REMOUNT | MS_BIND | MS_RDONLY, None), "read-only remount", path)
    except OSError:
        _LIBC.umount2(target, MNT_DETACH)
        raise


def undo_read_only(path: str) -> bool:
    """Remove the mount over ``path``; False when there was none (already undone)."""
    if path not in mount_points():
        return False
    _check(_LIBC.umount2(os.fsencode(path), MNT_DETACH), "unmount", path)
    return True


def mount_points() -> set[str]:
    """Mount points of this process's mount namespace (``/proc/self/mountinfo``)."""
    points = set()
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            fields = line.split()
            if len(fields) > 4:
                points.add(_unescape(fields[4]))
    return points


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as 3-digit octal escapes.
    for code in ("040", "011", "012", "134"):
        field = field.replace("\\" + code, chr(int(code, 8)))
    return field
