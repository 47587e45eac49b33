"""Shared mounts: listed in /proc/mounts with the expected type, responsive,
writable, fast enough, with room for checkpoints.

Everything that touches the mount runs in a child process
(:mod:`health.probes.storage_worker`) with a deadline: a hung NFS or Lustre
server, or a dead FUSE daemon, becomes a failure naming the step it hung in,
never a hung health check.
"""

from __future__ import annotations

import errno
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

from health.config import MountSpec, StorageChecks
from health.findings import Finding, ProbeResult, fail, ok
from health.parsers.mounts import mount_findings, parse_mounts
from health.probes.bounded import CommandResult, run_bounded_from_first_line

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "storage_worker.py")
WORKER_START_S = 30.0
"""How long the worker may take to start before it reaches the mount. Its deadline
(``health.storage.timeout_s``, 2 s in tests) counts from its first step, so that a node slow to
start a process is reported as overloaded, never as a mount hung "in start-up" it had not
touched yet."""

# errno name -> what it means on a shared mount and what to do about it.
ERRNO_MEANINGS = {
    "ESTALE": "stale file handle: the server restarted or the export changed; remount it",
    "ENOTCONN": "transport endpoint is not connected: the FUSE daemon died; "
                "fusermount -u (or umount -l) and remount",
    "ESHUTDOWN": "cannot send after transport endpoint shutdown: the Lustre client was "
                 "evicted; remount",
    "EROFS": "read-only file system; remount it read-write",
    "EACCES": "permission denied: the run's user cannot write here; fix owner or mode",
    "EPERM": "operation not permitted: the run's user cannot write here",
    "ENOSPC": "no space left on the file system",
    "EDQUOT": "disk quota exceeded",
    "EIO": "I/O error from the file system",
    "ETIMEDOUT": "the file server timed out",
    "EHOSTDOWN": "the file server is down",
    "EHOSTUNREACH": "the file server cannot be reached",
    "ECONNREFUSED": "the file server refused the connection",
    "ENOENT": "does not exist: the mount point is missing; create it and mount the file system",
    "ENOTDIR": "is not a directory",
    "EBUSY": "device or resource busy",
}


def explain_errno(name: str) -> str:
    """A person's reading of an errno name (``ESTALE`` -> stale file handle...)."""
    if name in ERRNO_MEANINGS:
        return ERRNO_MEANINGS[name]
    code = getattr(errno, name, None)
    return os.strerror(code) if isinstance(code, int) else f"error {name}"


def _messages(stdout: str) -> list[dict]:
    out = []
    for line in stdout.splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a partial last line from a killed worker
    return out


def _last_step(messages: list[dict]) -> str:
    steps = [m["step"] for m in messages if "step" in m]
    return steps[-1] if steps else "start-up"


def _worker_findings(spec: MountSpec, run: CommandResult, timeout_s: float) -> ProbeResult:
    messages = _messages(run.stdout)
    where = spec.path
    if run.status == "timeout" and not messages:
        return ProbeResult([fail(
            "storage.probe_not_started",
            f"{where}: the storage probe's worker did not start within {WORKER_START_S:g} s, "
            "before it touched the mount: the node is overloaded; drain it or check it again "
            "when it is idle", path=where, start_s=WORKER_START_S)])
    if run.status == "timeout":
        step = _last_step(messages)
        return ProbeResult([fail(
            "storage.hung",
            f"{where}: the probe hung in {step} and was stopped after {timeout_s:g} s: the "
            "file server is not answering (NFS 'not responding', dead FUSE daemon, evicted "
            "Lustre client); remount it or drain the node", path=where, step=step,
            timeout_s=timeout_s)])
    error = next((m["error"] for m in messages if "error" in m), None)
    if error is not None:
        name = error["errno"]
        return ProbeResult([fail(
            f"storage.{name.lower()}",
            f"{where}: {name} in {_last_step(messages)}: {explain_errno(name)}",
            path=where, errno=name, step=_last_step(messages), detail=error.get("message"))])
    result = next((m["result"] for m in messages if "result" in m), None)
    if result is None:
        return ProbeResult([fail("storage.probe_crashed",
                                 f"{where}: the storage probe exited with {run.returncode} "
                                 f"without a result: {run.stderr.strip()[-200:]}", path=where)])
    return _judge_figures(spec, result)


def _judge_figures(spec: MountSpec, figures: dict) -> ProbeResult:
    where = spec.path
    free_gb = figures["free_bytes"] / 1e9
    result = ProbeResult(figures={
        f"storage.write_mbps@{where}": round(figures["write_mbps"], 3),
        f"storage.read_mbps@{where}": round(figures["read_mbps"], 3),
        f"storage.latency_ms@{where}": round(figures["latency_ms"], 3),
        f"storage.free_gb@{where}": round(free_gb, 3)})
    limits = [
        (free_gb < spec.min_free_gb, "storage.low_space",
         f"{free_gb:.1f} GB free, checkpoints need {spec.min_free_gb:g} GB"),
        (figures["write_mbps"] < spec.min_write_mbps, "storage.slow_write",
         f"writes at {figures['write_mbps']:.1f} MB/s, below {spec.min_write_mbps:g} MB/s"),
        (figures["read_mbps"] < spec.min_read_mbps, "storage.slow_read",
         f"reads at {figures['read_mbps']:.1f} MB/s, below {spec.min_read_mbps:g} MB/s"),
        (figures["latency_ms"] > spec.max_latency_ms, "storage.slow_latency",
         f"small-file round trip takes {figures['latency_ms']:.1f} ms, above "
         f"{spec.max_latency_ms:g} ms"),
    ]
    for broken, code, text in limits:
        if broken:
            result.findings.append(fail(code, f"{where}: {text}", path=where))
    if not result.findings:
        result.findings.append(ok(
            "storage.ok", f"{where}: writable, {figures['write_mbps']:.0f} MB/s write, "
            f"{figures['read_mbps']:.0f} MB/s read, {figures['latency_ms']:.1f} ms, "
            f"{free_gb:.0f} GB free", path=where))
    return result


def _read_mounts_table() -> str:
    with open("/proc/mounts", encoding="utf-8", errors="replace") as table:
        return table.read()


def probe_mount(spec: MountSpec, checks: StorageChecks,
                mounts_text: Optional[str] = None) -> ProbeResult:
    """Check one mount. ``mounts_text`` replaces /proc/mounts (tests, other hosts)."""
    table = parse_mounts(mounts_text if mounts_text is not None else _read_mounts_table())
    found: list[Finding] = mount_findings(table, spec.path, spec.fstype)
    if any(f.code == "storage.not_mounted" for f in found):
        return ProbeResult(found)  # writing would test the wrong file system
    job = json.dumps({"path": spec.path, "probe_bytes": int(checks.probe_mb * 1e6),
                      "latency_ops": checks.latency_ops})
    run = run_bounded_from_first_line([sys.executable, "-I", "-S", WORKER, job], checks.timeout_s,
                                      WORKER_START_S)
    worker = _worker_findings(spec, run, checks.timeout_s)
    return ProbeResult(found + worker.findings, worker.figures,
                       {f"storage.fstype@{spec.path}": _fstype(found)})


def _fstype(findings: list[Finding]) -> Optional[str]:
    for finding in findings:
        if "fstype" in finding.evidence:
            return str(finding.evidence["fstype"])
    return None


def probe_storage(checks: StorageChecks, mounts_text: Optional[str] = None) -> ProbeResult:
    """Check every configured mount, in parallel (each bounded by its own timeout)."""
    result = ProbeResult()
    if not checks.mounts:
        return result
    with ThreadPoolExecutor(len(checks.mounts)) as pool:
        for part in pool.map(lambda s: probe_mount(s, checks, mounts_text), checks.mounts):
            result.extend(part)
    return result
