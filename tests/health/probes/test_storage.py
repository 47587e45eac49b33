"""The storage probe against real directories and real mounts: a tmpdir, a
read-only mount, a missing mount point, and mounts that hang or whose daemon
died (FUSE, in a private mount namespace when this machine allows it)."""

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from health.config import MountSpec, StorageChecks
from health.findings import Severity
from health.probes.storage import explain_errno, probe_mount, probe_storage
from health.probes.storage_worker import probe_file_names

HELPER = Path(__file__).with_name("namespace_helper.py")
QUICK = StorageChecks(timeout_s=10.0, probe_mb=1, latency_ops=2)


def spec(path, **limits):
    limits.setdefault("min_free_gb", 0.0)
    return MountSpec(path=str(path), **limits)


def failing(result):
    return {f.code: f for f in result.findings if f.severity is Severity.FAIL}


def can_make_mount_namespaces() -> bool:
    if shutil.which("unshare") is None or not os.path.exists("/dev/fuse"):
        return False
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "true"],
                           capture_output=True, timeout=10)
    return probe.returncode == 0


needs_namespaces = pytest.mark.skipif(not can_make_mount_namespaces(),
                                      reason="needs unshare -m and /dev/fuse (root)")


def in_namespace(kind, directory, timeout_s):
    run = subprocess.run(
        ["unshare", "-m", "--propagation", "private", sys.executable, str(HELPER), kind,
         str(directory), str(timeout_s)],
        capture_output=True, text=True, timeout=timeout_s + 30)
    assert run.returncode == 0, run.stderr
    return {f["code"]: f for f in json.loads(run.stdout)}


def test_a_healthy_directory_is_measured_and_left_clean(tmp_path):
    # No speed limit: what this directory measures depends on the load beside the test (a
    # loaded CI machine wrote 95.7 MB/s); slow storage is failed by the tests that ask for it.
    result = probe_mount(spec(tmp_path, min_write_mbps=0.0, min_read_mbps=0.0, max_latency_ms=float("inf")), QUICK)
    assert failing(result) == {}
    figures = {k.split("@")[0]: v for k, v in result.figures.items()}
    assert figures["storage.write_mbps"] > 0 and figures["storage.read_mbps"] > 0
    assert figures["storage.latency_ms"] > 0 and figures["storage.free_gb"] > 0
    assert result.facts[f"storage.fstype@{tmp_path}"]
    assert list(tmp_path.iterdir()) == []  # no probe file left behind


def test_thresholds_turn_figures_into_failures(tmp_path):
    result = probe_mount(spec(tmp_path, min_free_gb=1e9, min_write_mbps=1e9,
                              min_read_mbps=1e9, max_latency_ms=0.0), QUICK)
    assert set(failing(result)) == {"storage.low_space", "storage.slow_write",
                                    "storage.slow_read", "storage.slow_latency"}
    assert "checkpoints need" in failing(result)["storage.low_space"].message


def test_a_missing_mount_point_is_named(tmp_path):
    gone = failing(probe_mount(spec(tmp_path / "lustre" / "ckpt"), QUICK))["storage.enoent"]
    assert gone.evidence["step"] == "stat" and "mount point is missing" in gone.message


def test_a_shared_path_not_on_its_file_system_is_not_probed(tmp_path):
    result = probe_mount(spec(tmp_path, fstype="lustre"), QUICK)
    assert list(failing(result)) == ["storage.not_mounted"]
    assert result.figures == {}


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through directory modes")
def test_an_unwritable_directory_is_reported(tmp_path):
    tmp_path.chmod(0o555)
    try:
        denied = failing(probe_mount(spec(tmp_path), QUICK))["storage.eacces"]
    finally:
        tmp_path.chmod(0o755)
    assert denied.evidence["step"] == "write" and "permission denied" in denied.message


def test_a_probe_blocked_in_the_kernel_ends_at_its_timeout(tmp_path):
    # A FIFO where the probe writes: open() blocks in the kernel until a reader
    # comes, as a write to a hung server blocks until it answers.
    os.mkfifo(probe_file_names(str(tmp_path))[0])  # blocks for good: returning is the timeout at work
    result = probe_mount(spec(tmp_path), StorageChecks(timeout_s=1.0, probe_mb=1))
    hung = failing(result)["storage.hung"]
    assert hung.evidence["step"] == "write" and "stopped after 1 s" in hung.message


@needs_namespaces
def test_a_read_only_mount_is_reported(tmp_path):
    found = in_namespace("read_only", tmp_path, 10.0)
    assert found["storage.read_only"]["severity"] == "fail"
    assert found["storage.erofs"]["evidence"]["step"] == "write"
    assert "read-only file system" in found["storage.erofs"]["message"]


@needs_namespaces
def test_a_hung_fuse_mount_ends_at_its_timeout_and_is_reported(tmp_path):
    found = in_namespace("hung", tmp_path, 1.0)  # the mount never answers: returning is the timeout
    hung = found["storage.hung"]
    assert hung["severity"] == "fail" and hung["evidence"]["step"] == "stat"
    assert "not answering" in hung["message"]


@needs_namespaces
def test_a_dead_fuse_daemon_is_reported_by_errno_name(tmp_path):
    found = in_namespace("dead", tmp_path, 10.0)
    dead = found["storage.enotconn"]
    assert dead["evidence"]["errno"] == "ENOTCONN" and "fusermount -u" in dead["message"]


def test_dead_mount_errnos_are_explained_by_name():
    assert "stale file handle" in explain_errno("ESTALE")
    assert "Lustre client was evicted" in explain_errno("ESHUTDOWN")
    assert "FUSE daemon died" in explain_errno("ENOTCONN")
    assert explain_errno("ELOOP") == os.strerror(errno.ELOOP)


def test_every_configured_mount_is_probed(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    checks = StorageChecks(mounts=[spec(first), spec(second)], timeout_s=10.0, probe_mb=1,
                           latency_ops=2)
    result = probe_storage(checks)
    assert f"storage.write_mbps@{first}" in result.figures
    assert any(f.code == "storage.enoent" and f.evidence["path"] == str(second)
               for f in result.findings)
