"""--stage: the dataset is copied from the shared path to every node's local
disk under one progress bar, a killed copy resumes, and the check that
follows finds the data in place."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from health.config import DataChecks
from runmgr.healthcheck.nodes import alive_nodes
from runmgr.healthcheck.staging import stage_on_nodes
from tests import cli


def dataset(tmp_path: Path, megabytes: int = 3) -> tuple[Path, str]:
    shared = tmp_path / "hpfs" / "corpus.bin"
    shared.parent.mkdir()
    shared.write_bytes(os.urandom(megabytes * 1_000_000))
    return shared, hashlib.sha256(shared.read_bytes()).hexdigest()


def test_staging_copies_resumes_and_shows_one_progress_bar(local_ray, tmp_path):
    shared, digest = dataset(tmp_path)
    local = tmp_path / "local" / "corpus.bin"
    local.parent.mkdir()
    Path(str(local) + ".partial").write_bytes(shared.read_bytes()[:1_000_000])  # a killed copy
    data = DataChecks(local_path=str(local), shared_path=str(shared), sha256=digest, chunk_mb=0.25)
    lines: list[str] = []
    assert stage_on_nodes(alive_nodes(), data, lines.append) == {}
    assert hashlib.sha256(local.read_bytes()).hexdigest() == digest
    assert not Path(str(local) + ".partial").exists()
    assert any("copied 2.0 MB, resumed at 1.0 MB" in line for line in lines), lines
    bars = [line for line in lines if "[" in line and "%" in line]
    assert bars and "100%" in bars[-1]

    lines.clear()
    assert stage_on_nodes(alive_nodes(), data, lines.append) == {}
    assert any("already staged" in line for line in lines)


def test_a_damaged_shared_copy_fails_the_node_with_the_reason(local_ray, tmp_path):
    shared, _ = dataset(tmp_path, megabytes=1)
    data = DataChecks(local_path=str(tmp_path / "local.bin"), shared_path=str(shared), sha256="0" * 64)
    failures = stage_on_nodes(alive_nodes(), data, lambda line: None)
    (findings,) = failures.values()
    assert findings[0].code == "data.stage_failed" and "the shared copy is damaged" in findings[0].message


def test_stage_without_paths_is_one_line_and_exit_2(tmp_path):
    result = cli.runmgr("health-check", "--stage", cwd=tmp_path, timeout=60)  # refused before any Ray
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1
    assert "--stage needs health.data.shared_path" in lines[0]
