"""A bucket the run cannot use is refused before training starts, through the
real command against a real S3 server (SeaweedFS, accepting one identity):
wrong credentials, an unknown bucket and an endpoint that does not answer are
each one line on stderr, exit code 2, no traceback, no secret, nothing
written (no run directory)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests import cli
from tests.seaweed import SECRET_KEY, SeaweedS3, serving

ROOT = Path(__file__).resolve().parents[2]
BUCKET = "runmgr-probe"
WRONG_SECRET = "wrong-secret-that-must-never-be-printed"


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> SeaweedS3:
    yield from serving(tmp_path_factory.mktemp("seaweed-probe"), BUCKET)


def launch(run_dir: Path, endpoint: str, bucket: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """The real command, its own process with ``env`` (the credentials), forked from the session's
    CLI fork server (tests/cli.py): no new Python importing the CLI and torch each."""
    return cli.runmgr("launch", "conf=demo", f"run.dir={run_dir}", "chaos=none", "health.skip=true",
                      "training.train_iters=2", f"checkpoint.s3.bucket={bucket}", f"checkpoint.s3.endpoint={endpoint}",
                      "checkpoint.s3.connect_timeout_s=1", "checkpoint.s3.max_attempts=1", cwd=ROOT, env=env,
                      timeout=120)


def one_line_refusal(result: subprocess.CompletedProcess, run_dir: Path) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == "" and "Traceback" not in result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("runmgr: error: checkpoint.s3")
    assert not run_dir.exists(), "a refused launch wrote its run directory"
    return line


def test_wrong_credentials(server, tmp_path):
    env = {**server.env(), "AWS_SECRET_ACCESS_KEY": WRONG_SECRET}
    line = one_line_refusal(launch(tmp_path / "run", server.endpoint, BUCKET, env), tmp_path / "run")
    assert "refused the credentials" in line and "AWS_ACCESS_KEY_ID" in line
    assert WRONG_SECRET not in line and SECRET_KEY not in line


def test_an_unknown_bucket(server, tmp_path):
    line = one_line_refusal(launch(tmp_path / "run", server.endpoint, "no-such-bucket", server.env()), tmp_path / "run")
    assert f"checkpoint.s3.bucket 'no-such-bucket' does not exist at {server.endpoint}" in line


def test_an_endpoint_that_does_not_answer(server, tmp_path):
    silent = SeaweedS3(tmp_path / "never-started")
    line = one_line_refusal(launch(tmp_path / "run", silent.endpoint, BUCKET, server.env()), tmp_path / "run")
    assert f"checkpoint.s3.endpoint {silent.endpoint}" in line and "does not answer" in line
