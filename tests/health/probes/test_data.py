"""Dataset verification and resumable staging, with a real kill -9 mid-copy."""

import hashlib
import os
import signal
import subprocess
import sys

import pytest

from health.config import DataChecks
from health.findings import Severity
from health.probes.data import (StagingError, progress_line, sha256_of, stage_dataset,
                                verify_dataset)

CHUNK = 1 << 16


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "shared" / "corpus.bin"
    path.parent.mkdir()
    path.write_bytes(os.urandom(16 * CHUNK + 123))
    return path


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_staging_copies_verifies_and_reports_progress(source, tmp_path):
    target = tmp_path / "local" / "corpus.bin"
    seen = []
    outcome = stage_dataset(str(source), str(target), digest(source), CHUNK,
                            lambda done, total: seen.append((done, total)))
    assert target.read_bytes() == source.read_bytes()
    assert outcome.sha256 == digest(source) and outcome.resumed_from == 0
    assert seen[-1] == (source.stat().st_size,) * 2
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert not (tmp_path / "local" / "corpus.bin.partial").exists()
    again = stage_dataset(str(source), str(target), digest(source), CHUNK)
    assert again.copied_bytes == 0  # already staged: nothing copied


def test_staging_resumes_after_the_copier_is_killed(source, tmp_path):
    target = tmp_path / "local" / "corpus.bin"
    copier = subprocess.Popen(
        [sys.executable, "-c",
         "import sys\n"
         "from health.probes.data import stage_dataset\n"
         "def progress(done, total):\n"
         "    print(done, flush=True)\n"
         "    sys.stdin.readline()  # wait here: the test kills us mid-copy\n"
         f"stage_dataset({str(source)!r}, {str(target)!r}, chunk_bytes={CHUNK}, "
         "progress=progress)\n"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    first = int(copier.stdout.readline())
    os.kill(copier.pid, signal.SIGKILL)
    copier.wait(timeout=10)
    copier.stdin.close()
    copier.stdout.close()
    assert not target.exists()  # a killed copy never looks staged
    seen = []
    outcome = stage_dataset(str(source), str(target), digest(source), CHUNK,
                            lambda done, total: seen.append(done))
    assert outcome.resumed_from == first == CHUNK
    assert outcome.copied_bytes == source.stat().st_size - first
    assert seen[0] == first + CHUNK
    assert digest(target) == digest(source)


def test_a_torn_partial_file_is_copied_again_from_the_start(source, tmp_path):
    target = tmp_path / "local" / "corpus.bin"
    target.parent.mkdir()
    torn = bytearray(source.read_bytes()[: 3 * CHUNK])
    torn[-1] ^= 0xFF
    (tmp_path / "local" / "corpus.bin.partial").write_bytes(bytes(torn))
    outcome = stage_dataset(str(source), str(target), digest(source), CHUNK)
    assert outcome.resumed_from == 0 and digest(target) == digest(source)


def test_a_source_that_does_not_match_its_checksum_is_not_staged(source, tmp_path):
    target = tmp_path / "local" / "corpus.bin"
    with pytest.raises(StagingError, match="expected 0000"):
        stage_dataset(str(source), str(target), "0000" + "f" * 60, CHUNK)
    assert not target.exists()
    with pytest.raises(StagingError, match="does not exist"):
        stage_dataset(str(tmp_path / "nope.bin"), str(target))


def test_verification_verdicts(source, tmp_path):
    local = tmp_path / "local.bin"
    checks = DataChecks(local_path=str(local), shared_path=str(source), sha256=digest(source))
    assert verify_dataset(checks).findings[0].code == "data.missing"
    local.write_bytes(source.read_bytes()[:-1])
    (short,) = verify_dataset(checks).findings  # size taken from the shared copy
    assert short.code == "data.size_mismatch" and short.severity is Severity.FAIL
    corrupt = bytearray(source.read_bytes())
    corrupt[5] ^= 1
    local.write_bytes(bytes(corrupt))
    assert verify_dataset(checks).findings[0].code == "data.checksum_mismatch"
    local.write_bytes(source.read_bytes())
    good = verify_dataset(checks)
    assert good.findings[0].code == "data.ok" and sha256_of(str(local)) == digest(source)
    assert verify_dataset(DataChecks()).findings[0].code == "data.not_configured"


def test_progress_line_reads_well():
    assert progress_line(1, 3, width=12, label="stage corpus.bin") == \
        "stage corpus.bin [####........]  33%  0.00/0.00 GB"
    assert progress_line(3_000_000_000, 3_000_000_000, width=4).startswith("[####] 100%")
