"""Run ``runmgr`` with a hung FUSE mount at DIR, in this private mount namespace.

Started as ``unshare -m --propagation private python hung_mount_run.py DIR
ARGS...``: mounts a FUSE file system whose daemon never answers (what a hung
NFS/Lustre server looks like to a process), then runs ``runmgr ARGS`` here, so
that the local Ray it starts (and the probes) see the hung mount.
"""

import ctypes
import os
import sys

from runmgr.cli import main

_LIBC = ctypes.CDLL(None, use_errno=True)


def mount_hung_fuse(directory: str) -> int:
    fuse = os.open("/dev/fuse", os.O_RDWR)
    data = f"fd={fuse},rootmode=40000,user_id=0,group_id=0".encode()
    if _LIBC.mount(b"runmgr-test", directory.encode(), b"fuse.runmgr-test", 0, data):
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), directory)
    return fuse  # kept open and never read: every request on the mount waits


if __name__ == "__main__":
    mount_hung_fuse(sys.argv[1])
    sys.exit(main(sys.argv[2:]))
