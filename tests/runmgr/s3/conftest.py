"""One real S3 server (SeaweedFS) for the tests of the mirror, and a fresh bucket per test."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from runmgr.config.s3 import S3Config
from runmgr.s3.client import S3Client
from tests.faults.checkpoint_damage import small_checkpoint
from tests.seaweed import ACCESS_KEY, SECRET_KEY, SeaweedS3, serving
from trainer.manifest import checkpoint_dir, write_manifest

_buckets = itertools.count()
BIG_FILE = "extra.bin"
BIG_SIZE = 11 * 1024 * 1024 + 123
"""Three parts of 5 MiB (S3's smallest) with a short last one."""


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> SeaweedS3:
    """A server that accepts only the tests' identity (so wrong credentials are refused for real)."""
    yield from serving(tmp_path_factory.mktemp("seaweed"))


@pytest.fixture
def aws_env(monkeypatch, tmp_path) -> None:
    """The tests' credentials, the standard way (environment), and no ~/.aws of the machine's."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no credential lookup off this machine


def s3_config(server: SeaweedS3, bucket: str, **settings) -> S3Config:
    """Small parts and short waits: a test's checkpoints go up in parts, its retries come quickly."""
    values = dict(bucket=bucket, endpoint=server.endpoint, multipart_threshold_mib=0.01,
                  multipart_chunksize_mib=5.0, retry_backoff_s=0.05, max_backoff_s=0.2, connect_timeout_s=1.0,
                  max_attempts=1)
    return S3Config(**{**values, **settings})


@pytest.fixture
def s3(s3_server, aws_env) -> S3Client:
    """A client of a new, empty bucket; the run's copies under the prefix ``run``."""
    bucket = s3_server.make_bucket(f"ckpt-{next(_buckets)}")
    return S3Client(s3_config(s3_server, bucket), "run")


def checkpoint_with_big_file(save_dir: Path, step: int) -> Path:
    """A real DCP checkpoint plus a file large enough for three parts, all in its manifest."""
    path = small_checkpoint(save_dir, step)
    (path / BIG_FILE).write_bytes(bytes(range(256)) * (BIG_SIZE // 256) + b"x" * (BIG_SIZE % 256))
    (path / "manifest.json").unlink()
    write_manifest(path, {"step": step, "consumed_samples": 8 * step, "time": 1000.0 + step})
    assert checkpoint_dir(save_dir, step) == path
    return path
