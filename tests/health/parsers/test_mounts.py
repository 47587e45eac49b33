import pytest

from health.findings import Severity
from health.parsers import mounts


@pytest.fixture
def table(fixture_text):
    return mounts.parse_mounts(fixture_text("mounts/proc_mounts.txt"))


def test_escaped_spaces_are_unescaped(table):
    entry = mounts.covering_mount(table, "/mnt/shared data/ckpt")
    assert entry.mountpoint == "/mnt/shared data" and entry.fstype == "lustre"
    assert mounts.unescape(r"/a\040b\011c\134d") == "/a b\tc\\d"


def test_longest_mount_point_serves_a_path(table):
    assert mounts.covering_mount(table, "/mnt/lustre/ckpt").fstype == "lustre"
    assert mounts.covering_mount(table, "/mnt/lustre/tmp/x").fstype == "tmpfs"
    assert mounts.covering_mount(table, "/mnt/lustrex").mountpoint == "/"  # not a prefix match
    lustre = mounts.covering_mount(table, "/mnt/lustre")
    assert lustre.source == "10.149.200.5@o2ib:10.149.200.4@o2ib:/fs"


@pytest.mark.parametrize("expected, actual, matches", [
    ("nfs", "nfs4", True), ("nfs", "nfs", True), ("fuse", "fuse.s3fs", True),
    ("fuse.s3fs", "fuse.s3fs", True), ("lustre", "gpfs", False), ("gpfs", "gpfs", True),
])
def test_type_families(expected, actual, matches):
    assert mounts.fstype_matches(expected, actual) is matches


@pytest.mark.parametrize("path, fstype, severity, code", [
    ("/mnt/lustre/ckpt", "lustre", Severity.OK, "storage.mounted"),
    ("/soft/x", "gpfs", Severity.OK, "storage.mounted"),
    ("/mnt/nobackup", "gpfs", Severity.OK, "storage.mounted"),
    ("/mnt/nfs/run12", "nfs", Severity.OK, "storage.mounted"),
    ("/data/shards", "fuse", Severity.OK, "storage.mounted"),
    ("/mnt/archive/old", "nfs", Severity.FAIL, "storage.read_only"),
    ("/mnt/gpfs/ckpt", "gpfs", Severity.FAIL, "storage.not_mounted"),
    ("/mnt/lustre/tmp/ckpt", "lustre", Severity.FAIL, "storage.not_mounted"),
    ("/local/scratch", None, Severity.OK, "storage.mounted"),
])
def test_mount_verdicts(table, path, fstype, severity, code):
    (finding,) = mounts.mount_findings(table, path, fstype)
    assert (finding.severity, finding.code) == (severity, code)


def test_unmounted_shared_path_says_what_serves_it_instead(table):
    (finding,) = mounts.mount_findings(table, "/mnt/gpfs/ckpt", "gpfs")
    assert "served by overlay at /" in finding.message
