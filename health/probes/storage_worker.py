"""The part of the storage probe that touches the mount, run as its own process.

A stat on a dead NFS or FUSE mount can block in the kernel for ever, so the
parent (:mod:`health.probes.storage`) runs this script with a deadline and
kills it. Standard library only and no package imports, so that it starts in
a few tens of milliseconds (``python -I -S storage_worker.py SPEC``).

It prints one JSON object per line: ``{"step": name}`` before each step (so
that a hang can be located), then ``{"result": {...}}`` or
``{"error": {"step", "errno", "message"}}``.
"""

import errno
import hashlib
import json
import os
import socket
import statistics
import sys
import time

_CHUNK = 1 << 20
_SMALL = b"runmgr health latency probe\n" * 146  # about 4 KiB


def _say(**message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def probe_file_names(directory):
    """Deterministic names, one pair per host: a killed probe leaves at most
    these two files behind, and the next probe overwrites them."""
    host = socket.gethostname() or "host"
    base = os.path.join(directory, ".runmgr-health-" + host)
    return base + ".probe", base + ".latency"


def _write(path, total_bytes, pattern):
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        written = 0
        while written < total_bytes:
            written += os.write(fd, pattern[: min(len(pattern), total_bytes - written)])
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - start


def _read(path):
    start = time.perf_counter()
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY)
    try:
        if hasattr(os, "posix_fadvise"):
            # Ask the kernel to drop its cached copy so that the read measures the
            # file system, not memory. Only a hint: file systems may ignore it.
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        size = 0
        while True:
            block = os.read(fd, _CHUNK)
            if not block:
                break
            size += len(block)
            digest.update(block)
    finally:
        os.close(fd)
    return time.perf_counter() - start, size, digest.hexdigest()


def _latency_ms(path, ops):
    samples = []
    for _ in range(ops):
        start = time.perf_counter()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, _SMALL)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.unlink(path)
        samples.append((time.perf_counter() - start) * 1000.0)
    return statistics.median(samples)


def probe(directory, probe_bytes, latency_ops):
    """Run every step on ``directory``; return the figures (raises OSError)."""
    probe_path, latency_path = probe_file_names(directory)
    _say(step="stat")
    if not os.path.isdir(directory):
        os.stat(directory)  # raises ENOENT / ESTALE / ENOTCONN ... when it is gone
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), directory)
    _say(step="statvfs")
    vfs = os.statvfs(directory)
    pattern = (hashlib.sha256(b"runmgr").digest() * (_CHUNK // 32))[:_CHUNK]
    _say(step="write")
    write_s = _write(probe_path, probe_bytes, pattern)
    _say(step="read")
    read_s, size, _digest = _read(probe_path)
    if size != probe_bytes:
        raise OSError(errno.EIO, f"read back {size} bytes of {probe_bytes} written", probe_path)
    _say(step="latency")
    latency = _latency_ms(latency_path, latency_ops)
    _say(step="cleanup")
    os.unlink(probe_path)
    return {
        "free_bytes": vfs.f_bavail * vfs.f_frsize,
        "write_mbps": probe_bytes / 1e6 / max(write_s, 1e-9),
        "read_mbps": probe_bytes / 1e6 / max(read_s, 1e-9),
        "latency_ms": latency,
    }


def main(argv):
    spec = json.loads(argv[1])
    try:
        result = probe(spec["path"], int(spec["probe_bytes"]), int(spec["latency_ops"]))
    except OSError as exc:
        code = exc.errno or 0
        _say(error={"errno": errno.errorcode.get(code, str(code)), "code": code,
                    "message": exc.strerror or str(exc), "filename": exc.filename})
        return 1
    _say(result=result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
