"""Run the storage probe against a real mount made in a private mount namespace.

Started by test_storage.py as ``unshare -m --propagation private python
namespace_helper.py KIND DIR TIMEOUT``; the mounts vanish with the namespace.
KIND is one of:
  read_only  a tmpfs mounted read-only;
  hung       a FUSE mount whose daemon never answers (what a hung server looks like);
  dead       a FUSE mount whose daemon has gone (its /dev/fuse descriptor closed).
Prints the probe's findings as JSON.
"""

import ctypes
import json
import os
import sys

from health.config import MountSpec, StorageChecks
from health.probes.storage import probe_mount

_LIBC = ctypes.CDLL(None, use_errno=True)


def _mount(source: str, target: str, fstype: str, flags: int, data: str) -> None:
    if _LIBC.mount(source.encode(), target.encode(), fstype.encode(), flags, data.encode()):
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), target)


def main(kind: str, directory: str, timeout_s: float) -> None:
    if kind == "read_only":
        _mount("tmpfs", directory, "tmpfs", 1, "size=1m")  # MS_RDONLY = 1
    else:
        fuse = os.open("/dev/fuse", os.O_RDWR)
        _mount("runmgr-test", directory, "fuse.runmgr-test", 0,
               f"fd={fuse},rootmode=40000,user_id=0,group_id=0")
        if kind == "dead":
            os.close(fuse)  # the daemon is gone: the kernel aborts the connection
    checks = StorageChecks(timeout_s=timeout_s, probe_mb=1, latency_ops=2)
    result = probe_mount(MountSpec(path=directory, min_free_gb=0.0), checks)
    print(json.dumps([f.to_dict() for f in result.findings]))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]))
