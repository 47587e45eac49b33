"""The run's dataset on local disk (seed 000: pre-copy the data to every node
instead of reading a shared disk from many nodes).

:func:`verify_dataset` checks presence, size and SHA-256; :func:`stage_dataset`
copies from the shared mount into ``<target>.partial`` and renames it into
place only when complete and verified, so a crash never leaves a file that
looks staged; a second call resumes where the first stopped.
"""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass
from typing import Callable, Optional

from health.config import DataChecks
from health.findings import ProbeResult, fail, ok
from health.probes.bounded import run_bounded

Progress = Callable[[int, int], None]
"""Called with (bytes done, bytes total) after every chunk."""
_SYNC_EVERY = 64 << 20
_STAT_TIMEOUT_S = 30.0


class StagingError(RuntimeError):
    """The dataset could not be staged; the message says why and what to do."""


@dataclass(frozen=True)
class StageOutcome:
    """What a staging call did."""

    target: str
    total_bytes: int
    resumed_from: int
    """Bytes already in the partial file when this call started (0: fresh copy)."""
    copied_bytes: int
    sha256: str


def sha256_of(path: str, chunk_bytes: int = 8 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(chunk_bytes), b""):
            digest.update(block)
    return digest.hexdigest()


def progress_line(done: int, total: int, width: int = 30, label: str = "") -> str:
    """``stage corpus.bin [##########..........]  33%  0.10/0.30 GB``."""
    fraction = done / total if total else 1.0
    filled = int(round(fraction * width))
    bar = "#" * filled + "." * (width - filled)
    name = f"{label} " if label else ""
    return f"{name}[{bar}] {fraction:4.0%}  {done / 1e9:.2f}/{total / 1e9:.2f} GB"


def _tail_matches(source: str, partial: str, offset: int, chunk: int) -> bool:
    """Cheap check before resuming: the partial's last chunk equals the source's."""
    start = max(0, offset - chunk)
    with open(source, "rb") as src, open(partial, "rb") as dst:
        src.seek(start)
        dst.seek(start)
        return src.read(offset - start) == dst.read(offset - start)


def _resume_offset(source: str, partial: str, total: int, chunk: int) -> int:
    if not os.path.exists(partial):
        return 0
    offset = os.path.getsize(partial)
    if offset > total or not _tail_matches(source, partial, offset, chunk):
        return 0  # a torn or foreign partial file: start over
    return offset


def _copy_from(source: str, partial: str, offset: int, total: int, chunk: int,
               progress: Optional[Progress]) -> str:
    digest = hashlib.sha256()
    mode = "r+b" if offset else "w+b"
    with open(source, "rb") as src, open(partial, mode) as dst:
        dst.truncate(offset)
        dst.seek(0)
        for block in iter(lambda: dst.read(min(chunk, offset - dst.tell())), b""):
            digest.update(block)  # hash what an earlier call already copied
        src.seek(offset)
        dst.seek(offset)
        done, unsynced = offset, 0
        for block in iter(lambda: src.read(chunk), b""):
            dst.write(block)
            digest.update(block)
            done += len(block)
            unsynced += len(block)
            if unsynced >= _SYNC_EVERY:
                dst.flush()
                os.fsync(dst.fileno())
                unsynced = 0
            if progress is not None:
                dst.flush()  # what progress reports has reached the OS (survives a kill)
                progress(done, total)
        dst.flush()
        os.fsync(dst.fileno())
    return digest.hexdigest()


def stage_dataset(source: str, target: str, expected_sha256: Optional[str] = None,
                  chunk_bytes: int = 8 << 20, progress: Optional[Progress] = None
                  ) -> StageOutcome:
    """Copy ``source`` to ``target`` (resumable), verify, then rename into place."""
    if not os.path.isfile(source):
        raise StagingError(f"cannot stage: the shared copy {source} does not exist; "
                           "check health.data.shared_path and the mount")
    total = os.path.getsize(source)
    if os.path.isfile(target) and os.path.getsize(target) == total and (
            expected_sha256 is None or sha256_of(target, chunk_bytes) == expected_sha256):
        return StageOutcome(target, total, total, 0, expected_sha256 or "")
    os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
    partial = target + ".partial"
    offset = _resume_offset(source, partial, total, chunk_bytes)
    digest = _copy_from(source, partial, offset, total, chunk_bytes, progress)
    if expected_sha256 and digest != expected_sha256:
        if offset:  # the old partial may be corrupt: one fresh copy
            os.unlink(partial)
            return stage_dataset(source, target, expected_sha256, chunk_bytes, progress)
        raise StagingError(
            f"cannot stage {source}: its SHA-256 is {digest}, expected {expected_sha256}; "
            "the shared copy is damaged or the configured checksum is wrong")
    os.replace(partial, target)
    _fsync_dir(os.path.dirname(os.path.abspath(target)))
    return StageOutcome(target, total, offset, total - offset, digest)


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)  # make the rename durable
    finally:
        os.close(fd)


def _shared_size(path: str) -> Optional[int]:
    """Size of the shared copy, read in a bounded child: a dead mount must not hang us."""
    run = run_bounded([sys.executable, "-I", "-S", "-c",
                       "import os,sys; print(os.stat(sys.argv[1]).st_size)", path],
                      _STAT_TIMEOUT_S)
    return int(run.stdout) if run.status == "ok" and run.stdout.strip().isdigit() else None


def verify_dataset(checks: DataChecks) -> ProbeResult:
    """Is the dataset on local disk, of the expected size and checksum?"""
    path = checks.local_path
    if path is None:
        return ProbeResult([ok("data.not_configured", "no local dataset configured")])
    hint = "stage it with `runmgr health-check --stage`"
    if not os.path.isfile(path):
        return ProbeResult([fail("data.missing", f"dataset {path} is not on local disk: {hint}",
                                 path=path)])
    size = os.path.getsize(path)
    expected = checks.size_bytes
    if expected is None and checks.shared_path:
        expected = _shared_size(checks.shared_path)
    if expected is not None and size != expected:
        return ProbeResult([fail("data.size_mismatch",
                                 f"dataset {path} has {size} bytes, expected {expected}: "
                                 f"an interrupted copy? {hint}", path=path, size=size,
                                 expected=expected)])
    if checks.sha256:
        digest = sha256_of(path, int(checks.chunk_mb * 1e6))
        if digest != checks.sha256:
            return ProbeResult([fail("data.checksum_mismatch",
                                     f"dataset {path} has SHA-256 {digest[:12]}..., expected "
                                     f"{checks.sha256[:12]}...: the copy is corrupt; {hint}",
                                     path=path, sha256=digest)])
    return ProbeResult([ok("data.ok", f"dataset {path} present ({size} bytes, "
                           f"{'checksum verified' if checks.sha256 else 'size only'})",
                           path=path)], facts={"data.size_bytes": size})
