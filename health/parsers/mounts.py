"""``/proc/mounts``: which file system serves a path, with which type and options.

Lines are ``source mountpoint fstype options dump pass``; the kernel escapes
space, tab, newline and backslash in paths as octal (``\\040`` ...).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Optional, Sequence

from health.findings import Finding, fail, ok

_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")

# Expected type names a user writes in the config, and the kernel types they accept.
_FAMILIES = {
    "nfs": ("nfs", "nfs4"),
    "lustre": ("lustre",),
    "gpfs": ("gpfs",),
    "fuse": ("fuse",),
}


@dataclass(frozen=True)
class MountEntry:
    """One line of /proc/mounts, unescaped."""

    source: str
    mountpoint: str
    fstype: str
    options: tuple[str, ...]

    @property
    def read_only(self) -> bool:
        return "ro" in self.options


def unescape(field: str) -> str:
    """Undo the kernel's octal escapes (``/mnt/a\\040b`` -> ``/mnt/a b``)."""
    return _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mounts(text: str) -> list[MountEntry]:
    """Parse /proc/mounts text; malformed lines are skipped (the kernel writes none)."""
    entries = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        source, mountpoint, fstype, options = parts[:4]
        entries.append(
            MountEntry(unescape(source), unescape(mountpoint), fstype, tuple(options.split(",")))
        )
    return entries


def covering_mount(entries: Sequence[MountEntry], path: str) -> Optional[MountEntry]:
    """The mount that serves ``path``: the longest mount point that contains it.

    Later lines win on equal mount points, as a later mount hides an earlier one.
    """
    target = os.path.normpath(path)
    best: Optional[MountEntry] = None
    for entry in entries:
        point = os.path.normpath(entry.mountpoint)
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) >= len(os.path.normpath(best.mountpoint))):
            best = entry
    return best


def fstype_matches(expected: str, actual: str) -> bool:
    """True when the kernel type ``actual`` is of the family the user ``expected``.

    ``nfs`` accepts nfs and nfs4; ``fuse`` accepts any ``fuse.<name>``; other
    names must match exactly (``lustre``, ``gpfs``, ``fuse.s3fs`` ...).
    """
    expected = expected.lower()
    actual = actual.lower()
    if expected == "fuse":
        return actual == "fuse" or actual.startswith("fuse.")
    return actual in _FAMILIES.get(expected, (expected,))


def mount_findings(
    entries: Sequence[MountEntry], path: str, expected_fstype: Optional[str]
) -> list[Finding]:
    """Judge whether ``path`` is served by a mount of the expected type.

    With no expected type (a local directory), only the serving mount is reported.
    """
    entry = covering_mount(entries, path)
    if entry is None:
        return [fail("storage.not_mounted", f"{path} is in no mount listed in /proc/mounts",
                     path=path)]
    evidence = dict(path=path, mountpoint=entry.mountpoint, fstype=entry.fstype,
                    source=entry.source)
    if expected_fstype and not fstype_matches(expected_fstype, entry.fstype):
        return [fail(
            "storage.not_mounted",
            f"{path} is not on a {expected_fstype} mount: it is served by {entry.fstype} "
            f"at {entry.mountpoint} (mount the shared file system, then check again)",
            expected=expected_fstype, **evidence)]
    if entry.read_only:
        return [fail("storage.read_only",
                     f"{entry.mountpoint} ({entry.fstype}) is mounted read-only; "
                     "checkpoints cannot be written (remount rw)", **evidence)]
    return [ok("storage.mounted", f"{path} is on {entry.fstype} at {entry.mountpoint}",
               **evidence)]
